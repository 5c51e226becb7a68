"""Generated media for the dataset tests: PIL images with known colours, PyAV videos whose
frame ``i`` is the grey level ``16 + 8·i`` (so decoded frames reveal their source index)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def halves(height: int, width: int, left: tuple, right: tuple) -> np.ndarray:
    """An RGB array whose left half is ``left`` and right half ``right``."""
    array = np.zeros((height, width, 3), np.uint8)
    array[:, : width // 2] = left
    array[:, width // 2 :] = right
    return array


def solid(height: int, width: int, colour: tuple) -> np.ndarray:
    return np.full((height, width, 3), colour, np.uint8)


def write_image(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **({"lossless": True} if path.suffix == ".webp" else {}))
    return path


def frame_level(index: int) -> int:
    return 16 + 8 * index


def write_video(path: Path, num_frames: int, fps: int = 16, height: int = 32, width: int = 48) -> Path:
    """H.264 (lossless setting) clip; frame ``i`` is uniformly grey ``frame_level(i)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "0", "preset": "ultrafast"}
        for index in range(num_frames):
            frame = av.VideoFrame.from_ndarray(solid(height, width, (frame_level(index),) * 3), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def decoded_indices(pixels: torch.Tensor) -> list[int]:
    """Source frame indices of a ``3×T×H×W`` clip in [-1, 1] written by :func:`write_video`."""
    levels = (pixels + 1.0).mul(127.5).mean(dim=(0, 2, 3))
    return [round((float(level) - 16) / 8) for level in levels]


def pixel(rgb: tuple) -> torch.Tensor:
    """The [-1, 1] value of an RGB colour, as a 3-vector."""
    return torch.tensor(rgb, dtype=torch.float32) / 127.5 - 1.0


def write_sana_zip(path: Path, clips: dict[str, int], fps: int = 16) -> Path:
    """A SANA-Video archive: ``KEY.mp4`` + ``KEY.json`` (height, width, prompt) per clip."""
    scratch = path.parent / f".{path.stem}_clips"
    with zipfile.ZipFile(path, "w") as archive:
        for key, frames in clips.items():
            clip = write_video(scratch / f"{key}.mp4", frames, fps)
            archive.write(clip, f"{key}.mp4")
            archive.writestr(f"{key}.json", json.dumps({"height": 32, "width": 48, "prompt": f"clip {key}"}))
    return path


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """Flat layout: three images with ``.txt`` captions (two lines in one: only the first counts)."""
    root = tmp_path / "flat"
    write_image(root / "a.png", halves(32, 64, RED, BLUE))
    (root / "a.txt").write_text("a red and blue card\nsecond line is ignored\n")
    write_image(root / "b.webp", solid(32, 32, GREEN))
    (root / "b.txt").write_text("green")
    write_image(root / "sub" / "c.jpg", solid(40, 40, (128, 128, 128)))
    (root / "sub" / "c.txt").write_text("grey")
    return root
