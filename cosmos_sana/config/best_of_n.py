"""``[custom.rollout.best_of_n]``: Sol-RL style best-of-n rollouts.

Per prompt, ``num_drafts`` seeds are drafted with a cheap preview (``preview_steps``
steps on ``preview_model``), scored, and the best ``⌈k/2⌉`` plus worst ``⌊k/2⌋`` seeds are
regenerated at full quality on ``fullrollout_model``; ``k`` (Sol-RL's ``full_rollout_num``)
is cosmos-rl's ``[rollout] n_generation``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosmos_sana.config.base import StrictModel

PreviewModel = Literal["peft", "compile", "fp8", "nvfp4"]


class BestOfNOptions(StrictModel):
    num_drafts: int = Field(ge=2, description="seeds drafted per prompt (Sol-RL num_image_per_prompt)")
    preview_steps: int = Field(default=6, ge=1, description="sampling steps of a draft")
    preview_model: PreviewModel = Field(
        default="peft",
        description="drafts run on: peft (LoRA unmerged), compile (LoRA merged into a copy + torch.compile), "
        "fp8 (merged copy, torchao float8; GPUs of compute capability >= 8.9), nvfp4 (merged copy, torchao NVFP4; "
        "Blackwell only)",
    )
    fullrollout_model: Literal["peft", "compile"] = Field(
        default="peft", description="full-quality regeneration runs on: peft or compile (as for preview_model)"
    )
    rollout_batch_size: int | None = Field(
        default=None, ge=1, description="samples per sampling call; default: largest divisor of num_drafts <= batch_cap"
    )
    batch_cap: int = Field(default=24, ge=1, description="upper bound of the automatic rollout batch size")
