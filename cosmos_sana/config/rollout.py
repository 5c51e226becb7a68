"""``[custom.rollout]``: sampler options beyond ``[policy.diffusers.sample]``.

Taken from cosmos-rl's own tables: steps (``num_steps`` / ``eval_num_steps``), CFG
(``guidance_scale``) and the SDE/CPS noise level η (``noise_level``) from
``[policy.diffusers.sample]``; image size and video frames from ``[policy.diffusers]``
(``inference_size``, ``train_frames`` for rollouts, ``inference_frames`` for validation).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosmos_sana.config.base import StrictModel
from cosmos_sana.config.best_of_n import BestOfNOptions


class RolloutOptions(StrictModel):
    sampler: Literal["ode", "sde", "cps"] = Field(
        default="ode",
        description="ode: deterministic Euler (Diffusion-NFT); sde: Flow-GRPO SDE; cps: coefficient-preserving SDE "
        "(η = [policy.diffusers.sample] noise_level)",
    )
    sigma_schedule: Literal["linear", "shifted"] = Field(
        default="linear", description="σ grid from 1 to 0: linear, or time-shifted by flow_shift"
    )
    flow_shift: float | None = Field(
        default=None, gt=0.0, description="shift of the 'shifted' σ grid; default: the pipeline scheduler's flow_shift"
    )
    best_of_n: BestOfNOptions | None = Field(default=None, description="Sol-RL best-of-n rollouts; off when unset")
