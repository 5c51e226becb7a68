"""JPEG compressibility: the size of the image saved as JPEG at quality 95.

compressibility = −KB / 500 (smaller files score higher); incompressibility = +KB,
with KB = bytes / 1000. Prompt-free plain functions (no weights).
"""

from __future__ import annotations

import io
from typing import Any

from cosmos_sana_plugins.rewards.ocr import to_pil

QUALITY = 95


def jpeg_kilobytes(media: Any) -> list[float]:
    sizes = []
    for image in to_pil(media):
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=QUALITY)
        sizes.append(buffer.tell() / 1000)
    return sizes


def jpeg_compressibility(media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
    return [-kb / 500 for kb in jpeg_kilobytes(media)]


def jpeg_incompressibility(media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
    return jpeg_kilobytes(media)
