"""Read image and video files into float tensors in [0, 1] (``C×H×W`` / ``T×C×H×W``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VIDEO_SUFFIXES = {".mp4", ".webm", ".mov", ".mkv", ".avi", ".m4v"}


def load_media(path: str | Path) -> Any:
    """An image (PIL-readable) as ``3×H×W`` or a video (PyAV) as ``T×3×H×W``, float in [0, 1]."""
    import numpy as np
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix.lower() in VIDEO_SUFFIXES:
        import av

        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        if not frames:
            raise ValueError(f"{path}: the video has no frames")
        return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float() / 255
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            array = np.array(image.convert("RGB"))
    except UnidentifiedImageError as exc:
        raise ValueError(f"{path}: not an image or a video ({', '.join(sorted(VIDEO_SUFFIXES))})") from exc
    return torch.from_numpy(array).permute(2, 0, 1).float() / 255
