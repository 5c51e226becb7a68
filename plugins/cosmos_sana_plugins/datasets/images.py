"""Image decoding and sizing: PIL decode, cover-resize + centre crop, SANA's aspect-ratio bins, [-1, 1]."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageOps

from cosmos_sana_plugins.datasets.errors import BadSampleError
from cosmos_sana_plugins.datasets.layouts import MediaSource

#: square ``size`` → the diffusers module defining ``ASPECT_RATIO_<size>_BIN``
_BIN_MODULES = {
    256: "diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha",
    512: "diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha",
    1024: "diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha",
    2048: "diffusers.pipelines.pixart_alpha.pipeline_pixart_sigma",
    4096: "diffusers.pipelines.sana.pipeline_sana",
}


def open_image(source: MediaSource) -> Image.Image:
    """The fully decoded RGB image; an unreadable or truncated file is a :class:`BadSampleError`."""
    try:
        with source.open() as stream, Image.open(stream) as image:
            image.load()
            return image.convert("RGB")
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError... for corrupt data
        raise BadSampleError(source, f"unreadable image ({type(exc).__name__}: {exc})") from exc


def image_size(source: MediaSource) -> tuple[int, int]:
    """``(height, width)`` from the header only."""
    try:
        with source.open() as stream, Image.open(stream) as image:
            width, height = image.size
    except Exception as exc:
        raise BadSampleError(source, f"unreadable image ({type(exc).__name__}: {exc})") from exc
    return height, width


def fit(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """Resize to cover ``size`` ([height, width]) keeping the aspect ratio, then crop the centre."""
    height, width = size
    if image.size == (width, height):
        return image
    return ImageOps.fit(image, (width, height), method=Image.Resampling.BICUBIC, centering=(0.5, 0.5))


def to_pixels(images: Sequence[Image.Image]) -> torch.Tensor:
    """``T×3×H×W`` float32 in [-1, 1] (what SANA's VAEs expect): ``v / 127.5 - 1``."""
    array = np.stack([np.asarray(image, dtype=np.uint8) for image in images])
    return torch.from_numpy(array).permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)


@functools.cache
def aspect_ratio_bins(resolution: int) -> dict[str, list[float]]:
    """diffusers' ``ASPECT_RATIO_<resolution>_BIN`` (ratio h/w → [height, width])."""
    import importlib

    if resolution not in _BIN_MODULES:
        raise ValueError(f"no aspect-ratio bins for size {resolution} (have {sorted(_BIN_MODULES)})")
    return getattr(importlib.import_module(_BIN_MODULES[resolution]), f"ASPECT_RATIO_{resolution}_BIN")


def bucket_size(height: int, width: int, resolution: int) -> tuple[int, int]:
    """The bin nearest to ``height / width`` (diffusers' ``classify_height_width_bin``)."""
    from diffusers.image_processor import PixArtImageProcessor

    return PixArtImageProcessor.classify_height_width_bin(height, width, aspect_ratio_bins(resolution))
