"""Video decoding with PyAV: which source frames make a clip, and decoding only those.

Frame ``k`` of a clip is source frame ``floor(k * step)``, ``step = source_fps / fps`` when a
target ``fps`` is set, else ``stride``; clips start at the first frame. A source with fewer
frames than the clip needs follows ``short_clip``: ``error`` (a bad sample), ``pad_last``
(indices past the end become the last frame) or ``loop`` (indices wrap: ``i mod available``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image

from cosmos_sana_plugins.datasets.errors import BadSampleError
from cosmos_sana_plugins.datasets.layouts import MediaSource

ShortClip = Literal["error", "pad_last", "loop"]


@dataclass(frozen=True)
class VideoInfo:
    """Container metadata (``frames`` is 0 when the container does not store it)."""

    frames: int
    fps: float
    height: int
    width: int
    duration: float


class ClipTooShort(ValueError):
    """The source has ``available`` frames, the clip needs index ``needed``."""

    def __init__(self, available: int, needed: int):
        self.available, self.needed = available, needed
        super().__init__(f"clip too short: {available} frames, needs frame index {needed} (short_clip=error)")


def select_frame_indices(num_frames: int, step: float, available: int | None, short_clip: ShortClip) -> list[int]:
    """Source frame indices of a ``num_frames`` clip; ``available=None`` assumes a long enough source."""
    if num_frames < 1 or step <= 0:
        raise ValueError(f"num_frames must be ≥ 1 and step > 0, got {num_frames}, {step}")
    wanted = [math.floor(k * step + 1e-9) for k in range(num_frames)]
    if available is None or wanted[-1] < available:
        return wanted
    if available < 1:
        raise ClipTooShort(available, wanted[-1])
    if short_clip == "pad_last":
        return [min(i, available - 1) for i in wanted]
    if short_clip == "loop":
        return [i % available for i in wanted]
    raise ClipTooShort(available, wanted[-1])


def _info(container: Any) -> VideoInfo:
    if not container.streams.video:
        raise ValueError("no video stream")
    vstream = container.streams.video[0]
    fps = float(vstream.average_rate or vstream.guessed_rate or 0.0)
    if vstream.duration is not None and vstream.time_base is not None:
        duration = float(vstream.duration * vstream.time_base)
    elif container.duration is not None:
        duration = container.duration / 1_000_000
    else:
        duration = vstream.frames / fps if fps and vstream.frames else 0.0
    return VideoInfo(int(vstream.frames or 0), fps, vstream.codec_context.height, vstream.codec_context.width, duration)


def decode_clip(
    source: MediaSource, num_frames: int, *, fps: float | None, stride: int, short_clip: ShortClip
) -> tuple[list[Image.Image], list[int], VideoInfo]:
    """The clip's frames (RGB), their source indices, and the container metadata."""
    info, frames, available, step = _decode(source, num_frames, fps, stride, None)
    try:
        indices = select_frame_indices(num_frames, step, available, short_clip)
    except ClipTooShort as exc:
        raise BadSampleError(source, f"{exc}; {_rate_text(fps, stride, info.fps)}") from exc
    if any(i not in frames for i in indices):  # a short clip remapped onto frames not kept: decode again
        _, frames, _, _ = _decode(source, num_frames, fps, stride, set(indices))
    return [frames[i] for i in indices], indices, info


def _decode(source: MediaSource, num_frames: int, fps: float | None, stride: int,
            wanted: set[int] | None) -> tuple[VideoInfo, dict[int, Image.Image], int | None, float]:
    """Decode up to the last wanted index; ``available`` is None when the stream reached it, else its length."""
    import av

    try:
        with source.open() as stream, av.open(stream) as container:
            info = _info(container)
            if fps is not None and not info.fps:
                raise BadSampleError(source, "unknown source frame rate; cannot resample to fps")
            step = info.fps / fps if fps is not None else float(stride)
            if wanted is None:
                wanted = set(select_frame_indices(num_frames, step, None, "error"))
            last = max(wanted)
            frames: dict[int, Image.Image] = {}
            decoded = 0
            for index, frame in enumerate(container.decode(container.streams.video[0])):
                decoded = index + 1
                if index in wanted:
                    frames[index] = frame.to_image()
                if index >= last:
                    break
    except BadSampleError:
        raise
    except Exception as exc:  # PyAV raises several FFmpegError subclasses for broken files
        raise BadSampleError(source, f"unreadable video ({type(exc).__name__}: {exc})") from exc
    return info, frames, None if decoded > last else decoded, step


def _rate_text(fps: float | None, stride: int, source_fps: float) -> str:
    rate = f"fps={fps:g} from {source_fps:g}" if fps is not None else f"stride={stride}"
    return f"sampling {rate}"
