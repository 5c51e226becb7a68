"""``[[custom.rewards]]`` and ``[custom.reward_runtime]``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cosmos_sana.config.base import ComponentRef, StrictModel


class RewardRef(ComponentRef):
    weight: float = Field(default=1.0, description="weight in the total reward")
    clip_min: float | None = Field(default=None, description="clamp this component from below")
    clip_max: float | None = Field(default=None, description="clamp this component from above")
    scale: float = Field(default=1.0, description="multiply the clamped component before weighting")

    @model_validator(mode="after")
    def _clip_order(self) -> "RewardRef":
        if self.clip_min is not None and self.clip_max is not None and self.clip_min > self.clip_max:
            raise ValueError(f"clip_min {self.clip_min} > clip_max {self.clip_max}")
        return self


class RewardRuntime(StrictModel):
    mode: Literal["async", "sync"] = Field(default="async", description="score beside the loop or inline")
    workers: int = Field(default=1, ge=1, description="scoring worker threads")
    retries: int = Field(default=2, ge=0, description="retries per failing batch before the run fails")
    timeout_s: float = Field(default=600.0, gt=0, description="per-batch scoring timeout")
    device: str | None = Field(default=None, description="scoring device; default: the policy's")
