"""``[custom.trainer]``: algorithm options cosmos-rl's config has no field for.

Everything else comes from cosmos-rl's own fields: EMA from ``[train] ema_enable /
ema_decay / ema_update_step_interval``, KL weight and clipping from ``[train.train_policy]``
(``kl_beta``, ``epsilon_low/high``, ``advantage_low/high``, ``mu_iterations``,
``mini_batch``), NFT from ``[policy.diffusers]`` (``nft_beta``, ``timesteps_fraction``,
``weight_copy_decay_type``), timestep sampling from ``weighting_scheme``, ``logit_mean``,
``logit_std``, ``train_flow_shift``.
"""

from __future__ import annotations

from pydantic import Field

from cosmos_sana.config.base import StrictModel


class TrainerOptions(StrictModel):
    data_beta: float = Field(
        default=0.01, ge=0.0, description="DDRL: weight of the flow-matching loss on [custom.real_data]"
    )
    real_batch_size: int | None = Field(
        default=None, ge=1, description="DDRL: real samples per mini-batch; default train.train_policy.mini_batch"
    )
    val_max_samples: int = Field(default=4, ge=0, description="SFT: validation prompts rendered per validation")
