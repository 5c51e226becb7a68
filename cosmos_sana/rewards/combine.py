"""Weighted multi-reward: clamp each component, scale, weight, sum."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cosmos_sana.config import RewardRef


def combine(components: Mapping[str, Sequence[float]], refs: Sequence[RewardRef]) -> list[float]:
    """Total per sample: Σ_i weight_i · scale_i · clamp(score_i, clip_min_i, clip_max_i)."""
    if not refs:
        raise ValueError("no rewards configured: add [[custom.rewards]] entries")
    n = len(components[refs[0].name])
    total = [0.0] * n
    for ref in refs:
        scores = components[ref.name]
        if len(scores) != n:
            raise ValueError(f"reward {ref.name!r} returned {len(scores)} scores for {n} samples")
        for i, score in enumerate(scores):
            value = float(score)
            if ref.clip_min is not None:
                value = max(value, ref.clip_min)
            if ref.clip_max is not None:
                value = min(value, ref.clip_max)
            total[i] += ref.weight * ref.scale * value
    return total
