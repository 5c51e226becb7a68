"""``[[custom.rewards]]`` and ``[custom.reward_runtime]``.

The total reward of a sample is ``Σ weight · scale · clamp(score, clip_min, clip_max)``
over the ``[[custom.rewards]]`` entries; every component is reported beside it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cosmos_sana.config.base import ComponentRef, StrictModel


class RewardRef(ComponentRef):
    weight: float = Field(default=1.0, description="weight in the total reward")
    clip_min: float | None = Field(default=None, description="clamp this component from below")
    clip_max: float | None = Field(default=None, description="clamp this component from above")
    scale: float = Field(default=1.0, description="multiply the clamped component before weighting")
    label: str | None = Field(
        default=None, description="this term's name in scores and logs (default: name); lets a reward appear twice"
    )
    frame_stride: int = Field(
        default=4, ge=1, description="videos: an image scorer sees every N-th frame (0, N, 2N, …)"
    )

    @property
    def key(self) -> str:
        """The component's name in scores and logs."""
        return self.label or self.name

    @model_validator(mode="after")
    def _clip_order(self) -> "RewardRef":
        if self.clip_min is not None and self.clip_max is not None and self.clip_min > self.clip_max:
            raise ValueError(f"clip_min {self.clip_min} > clip_max {self.clip_max}")
        return self


class RewardRuntime(StrictModel):
    mode: Literal["async", "sync"] = Field(
        default="async",
        description="async: the rollout submits each [rollout] n_generation_mini_batch chunk for scoring while "
        "it samples the next, and the reward function collects the scores; sync: the reward function scores inline",
    )
    workers: int = Field(default=1, ge=1, description="scoring worker threads (async mode)")
    retries: int = Field(default=2, ge=0, description="retries of a failing or timed-out scorer before the run fails")
    timeout_s: float = Field(default=600.0, gt=0, description="time limit of one scorer call on one batch")
    device: str | None = Field(default=None, description="scoring device; default: the device of the media")
