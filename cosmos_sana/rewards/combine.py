"""Weighted multi-reward: clamp each component, scale, weight, sum."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cosmos_sana.config import RewardRef


class RewardValueError(ValueError):
    """A scorer returned the wrong number of scores, or a non-finite one."""


def check_scores(name: str, scores: Sequence[float], n: int) -> list[float]:
    """``scores`` as floats; an error naming the reward and batch index when one is unusable."""
    values = [float(s) for s in scores]
    if len(values) != n:
        raise RewardValueError(f"reward {name!r} returned {len(values)} scores for {n} samples")
    for i, value in enumerate(values):
        if not math.isfinite(value):
            raise RewardValueError(f"reward {name!r} returned {value} at batch index {i}")
    return values


def combine(components: Mapping[str, Sequence[float]], refs: Sequence[RewardRef]) -> list[float]:
    """Total per sample: Σ_i weight_i · scale_i · clamp(score_i, clip_min_i, clip_max_i); components by ``ref.key``."""
    if not refs:
        raise ValueError("no rewards configured: add [[custom.rewards]] entries")
    n = len(components[refs[0].key])
    total = [0.0] * n
    for ref in refs:
        scores = components[ref.key]
        if len(scores) != n:
            raise RewardValueError(f"reward {ref.key!r} returned {len(scores)} scores for {n} samples")
        for i, score in enumerate(scores):
            value = float(score)
            if ref.clip_min is not None:
                value = max(value, ref.clip_min)
            if ref.clip_max is not None:
                value = min(value, ref.clip_max)
            total[i] += ref.weight * ref.scale * value
    return total
