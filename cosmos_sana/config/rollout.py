"""``[custom.rollout]``: sampler options beyond ``[policy.diffusers.sample]``.

Taken from cosmos-rl's own tables: steps (``num_steps`` / ``eval_num_steps``), CFG
(``guidance_scale``) and the SDE/CPS noise level η (``noise_level``) from
``[policy.diffusers.sample]``; image size and video frames from ``[policy.diffusers]``
(``inference_size``, ``train_frames`` for rollouts, ``inference_frames`` for validation).
``[custom.rollout.speed]`` switches the sampling speed features (all off by default).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosmos_sana.config.base import StrictModel
from cosmos_sana.config.best_of_n import BestOfNOptions


class SpeedOptions(StrictModel):
    """``[custom.rollout.speed]``: the speed features the ``sana`` rollout installs (all off by default).

    The one schema of these features: the TOML table, and what ``fast_denoise.accelerate`` takes.
    Module-level features (attention, compiled blocks, VAE) act on the colocated policy model,
    so they apply to the trainer's forward too.
    """

    linear_attention: Literal["fp32", "bf16"] = Field(
        default="fp32", description="bf16: linear self-attention without diffusers' fp32 copies of q, k, v"
    )
    cache_text_kv: bool = Field(default=False, description="text cross-attention keys/values once per prompt batch")
    compile_blocks: bool = Field(default=False, description="torch.compile each transformer block in place")
    vae_channels_last: bool = Field(default=False, description="VAE in channels-last memory format")
    compile_vae: bool = Field(default=False, description="torch.compile the VAE decoder in place")
    compile_mode: str | None = Field(default=None, description="torch.compile mode; default: the backend's")
    compile_backend: str = Field(default="inductor", description="torch.compile backend")
    cuda_graph_max_batch: int = Field(
        default=0, ge=0, description="replay no-grad forwards of up to this batch from CUDA graphs (CUDA only); 0: off"
    )

    @property
    def enabled(self) -> bool:
        """Whether any feature is on."""
        return self != SpeedOptions(compile_mode=self.compile_mode, compile_backend=self.compile_backend)


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
    speed: SpeedOptions = Field(default_factory=SpeedOptions)
