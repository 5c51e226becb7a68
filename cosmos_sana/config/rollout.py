"""``[custom.rollout]``: sampler and best-of-n options beyond ``[policy.diffusers.sample]``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosmos_sana.config.base import StrictModel


class RolloutOptions(StrictModel):
    sampler: Literal["ode", "sde", "cps"] = Field(
        default="ode", description="ode: deterministic Euler (NFT); sde: Flow-GRPO; cps: coefficient-preserving"
    )
    eta: float = Field(default=0.7, ge=0.0, description="SDE noise level")
    sigma_schedule: Literal["linear", "shifted"] = Field(
        default="linear", description="σ grid from 1 to 0: linear, or shifted by the flow shift"
    )
