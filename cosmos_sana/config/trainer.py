"""``[custom.trainer]``: algorithm options cosmos-rl's config has no field for.

Everything else comes from cosmos-rl's own fields: EMA from ``[train] ema_enable /
ema_decay / ema_update_step_interval``, KL weight and clipping from ``[train.train_policy]``
(``kl_beta``, ``epsilon_low/high``, ``advantage_low/high``, ``mu_iterations``,
``mini_batch``), NFT from ``[policy.diffusers]`` (``nft_beta``, ``timesteps_fraction``,
``weight_copy_decay_type``), timestep sampling from ``weighting_scheme``, ``logit_mean``,
``logit_std``, ``train_flow_shift``.

The options below pick between forms the reference implementations use; each default is
the form of the paper's own code (docs/algorithms.md cites the code behind each). Each field's
description says which trainer reads it; an RL trainer refuses one it does not read.
"""

from __future__ import annotations

from typing import Literal

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
    on_non_finite: Literal["stop", "skip"] = Field(
        default="stop",
        description=(
            "a NaN/inf loss term or gradient: 'stop' raises naming the step and the term before any weight "
            "changes; 'skip' drops that optimizer update and counts it in train/skipped_updates"
        ),
    )
    kl_form: Literal["flow_grpo", "gaussian"] = Field(
        default="flow_grpo",
        description=(
            "Flow-GRPO KL per step: 'flow_grpo' = ‖μ_θ − μ_ref‖² / (2·std_dev_t²) with the SDE's std_dev_t "
            "(no sqrt|dt|), the form published kl_beta values assume; 'gaussian' = the exact KL of the two "
            "step Gaussians (divides by the full step variance, ≈ 1/|dt| times larger for the 'sde' sampler)"
        ),
    )
    cfg_uncond_grad: Literal["flow", "detach"] = Field(
        default="flow",
        description=(
            "Flow-GRPO/DDRL with guidance_scale > 1: 'flow' lets the gradient of the recomputed log-prob flow "
            "through the unconditional prediction too (current flow_grpo); 'detach' stops it there "
            "(flow_grpo's July 2025 train_sd3.py)"
        ),
    )
    advantage_std_ddof: Literal[0, 1] = Field(
        default=0,
        description=(
            "delta degrees of freedom of the advantage std: 0 = population std (flow_grpo and DiffusionNFT, "
            "numpy's np.std); 1 = sample std (cosmos-rl's WFM DDRL, torch.std)"
        ),
    )
    exp_reward: bool = Field(
        default=False,
        description=(
            "DDRL: advantage A → −exp(−A) before the advantage_low/high clip, as cosmos-rl's WFM DDRL "
            "[model.rl] exp_reward (default off there too)"
        ),
    )
