"""Write generated media: a PNG per image, an MP4 per video (PyAV; an animated GIF without it), a grid PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


def to_uint8(sample: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats → uint8 on CPU (rounded, clamped)."""
    return (sample.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()


def save_media(sample: torch.Tensor, path: Path, fps: int = 16) -> Path:
    """One image ``C×H×W`` (PNG) or video ``T×C×H×W`` (MP4 with PyAV, else GIF) in [0, 1]; returns the file."""
    pixels = to_uint8(sample)
    path.parent.mkdir(parents=True, exist_ok=True)
    if pixels.ndim == 3:
        from PIL import Image

        path = path.with_suffix(".png")
        Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(path)
    elif pixels.ndim == 4:
        try:
            import av
        except ImportError:  # PyAV is the optional [video] extra: an animated GIF instead
            return _save_gif(pixels, path.with_suffix(".gif"), fps)

        path = path.with_suffix(".mp4")
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=fps)
            stream.height, stream.width, stream.pix_fmt = pixels.shape[2], pixels.shape[3], "yuv420p"
            for frame in pixels.permute(0, 2, 3, 1).numpy():
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())
    else:
        raise ValueError(f"media must be C×H×W or T×C×H×W, got shape {tuple(sample.shape)}")
    return path


def _save_gif(pixels: torch.Tensor, path: Path, fps: int) -> Path:
    from PIL import Image

    frames = [Image.fromarray(frame) for frame in pixels.permute(0, 2, 3, 1).numpy()]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=round(1000 / fps), loop=0)
    return path


def save_grid(rows: Sequence[Sequence[torch.Tensor]], path: Path) -> Path:
    """Images ``C×H×W`` in [0, 1] tiled row by row (all the same size) into one PNG."""
    from PIL import Image

    tiles = [[to_uint8(image).permute(1, 2, 0).numpy() for image in row] for row in rows]
    height, width = tiles[0][0].shape[:2]
    grid = Image.new("RGB", (width * max(len(row) for row in tiles), height * len(tiles)))
    for r, row in enumerate(tiles):
        for c, tile in enumerate(row):
            grid.paste(Image.fromarray(tile), (c * width, r * height))
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return path

