"""Score videos with image scorers: sample frames, score them as one batch, reduce per video."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

ImageScorer = Callable[[Any, list[str], list[dict]], Sequence[float]]
Reduce = Literal["mean", "mean_positive"]


def sample_frames(video: Any, stride: int) -> Any:
    """Frames ``0, stride, 2·stride, …`` of a ``B×T×C×H×W`` batch."""
    if video.ndim != 5:
        raise ValueError(f"expected videos B×T×C×H×W, got shape {tuple(video.shape)}")
    return video[:, ::stride]


def reduce_frames(frame_scores: Sequence[float], how: Reduce) -> float:
    """One video's score from its frames' scores.

    ``mean``: the plain mean. ``mean_positive``: the mean over frames scoring > 0,
    and 0 when no frame does (the video OCR rule).
    """
    scores = [float(s) for s in frame_scores]
    if how == "mean_positive":
        scores = [s for s in scores if s > 0]
        return sum(scores) / len(scores) if scores else 0.0
    if how == "mean":
        return sum(scores) / len(scores)
    raise ValueError(f"unknown frame reduction {how!r}")


def score_video_frames(
    fn: ImageScorer,
    videos: Any,
    prompts: list[str],
    metadata: list[dict],
    *,
    stride: int,
    how: Reduce,
) -> list[float]:
    """Run an image scorer on the sampled frames of every video; one score per video."""
    frames = sample_frames(videos, stride)
    batch, per_video = frames.shape[0], frames.shape[1]
    flat = frames.reshape(batch * per_video, *frames.shape[2:])
    flat_scores = [float(s) for s in fn(flat, [p for p in prompts for _ in range(per_video)],
                                        [m for m in metadata for _ in range(per_video)])]
    if len(flat_scores) != batch * per_video:
        raise ValueError(f"image scorer returned {len(flat_scores)} scores for {batch * per_video} frames")
    return [reduce_frames(flat_scores[i * per_video:(i + 1) * per_video], how) for i in range(batch)]
