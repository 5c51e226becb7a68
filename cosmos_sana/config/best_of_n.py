"""``[custom.rollout.best_of_n]``: Sol-RL style best-of-n rollouts.

Per prompt, ``num_drafts`` seeds are drafted with a cheap preview (``preview_steps``
steps on ``preview_model``), scored, and the best ``⌈k/2⌉`` plus worst ``⌊k/2⌋`` seeds are
regenerated at full quality on ``fullrollout_model``; ``k`` is cosmos-rl's ``[rollout]
n_generation``.

Sol-RL's own names (``train_scripts/sol_rl/train_sana.py`` and ``configs/sol_rl/sana.py`` in
NVlabs/Sana) are accepted here with their meaning there; setting one of them and our name to
different values is an error:

* ``num_image_per_prompt`` = ``num_drafts`` (its ``sample.num_image_per_prompt``);
* ``preview_step`` = ``preview_steps`` (0, Sol-RL's "no preview" families, is refused: leave
  this table out for plain rollouts);
* ``full_rollout_num`` = ``[rollout] n_generation`` (its ``sample.full_rollout_num``; our
  recipes also keep every regenerated sample, which Sol-RL's presets do by setting its
  ``sample.best_of_n`` to the same number);
* ``preview_model = "compile_nvfp4"`` = ``"nvfp4"``; ``fullrollout_model = "compile_nvfp4"``
  (Sol-RL's "naive quant" baseline) is refused: full rollouts are the samples the policy
  trains on and run in its own precision.

Knowing differences: ``fp8`` is ours (Sol-RL has no FP8 preview); our NVFP4 preview quantizes
the transformer blocks' linear layers with torchao, where Sol-RL swaps linears of at least
``nvfp4_min_dim`` features for transformer-engine ones; for an odd ``k`` we keep one more best
than worst seed, Sol-RL's ``best_worst`` one more worst (the same split for every even ``k``,
as in all shipped recipes).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from cosmos_sana.config.base import StrictModel

PreviewModel = Literal["peft", "compile", "fp8", "nvfp4"]
TABLE = "custom.rollout.best_of_n"

#: Sol-RL's key → ours, within this table
SOL_RL_KEYS = {"num_image_per_prompt": "num_drafts", "preview_step": "preview_steps"}
#: Sol-RL's transformer names → ours
SOL_RL_MODELS = {"compile_nvfp4": "nvfp4"}


class BestOfNOptions(StrictModel):
    num_drafts: int = Field(ge=2, description="seeds drafted per prompt (Sol-RL: num_image_per_prompt)")
    preview_steps: int = Field(default=6, ge=1, description="sampling steps of a draft (Sol-RL: preview_step)")
    preview_model: PreviewModel = Field(
        default="peft",
        description="drafts run on: peft (LoRA unmerged), compile (LoRA merged into a copy + torch.compile), "
        "fp8 (merged copy, torchao float8; GPUs of compute capability >= 8.9), nvfp4 (merged copy, torchao NVFP4; "
        "Blackwell only; Sol-RL: compile_nvfp4)",
    )
    fullrollout_model: Literal["peft", "compile"] = Field(
        default="peft", description="full-quality regeneration runs on: peft or compile (as for preview_model)"
    )
    full_rollout_num: int | None = Field(
        default=None, ge=1,
        description="Sol-RL's name of [rollout] n_generation (seeds regenerated per prompt); must equal it when set",
    )
    rollout_batch_size: int | None = Field(
        default=None, ge=1, description="samples per sampling call; default: largest divisor of num_drafts <= batch_cap"
    )
    batch_cap: int = Field(default=24, ge=1, description="upper bound of the automatic rollout batch size")

    @model_validator(mode="before")
    @classmethod
    def _sol_rl_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("preview_step") == 0:
            raise ValueError(
                f"{TABLE}.preview_step = 0 (Sol-RL: no preview, every image at full quality) is not supported; "
                f"set preview_step (or preview_steps) >= 1, or leave [{TABLE}] out for plain rollouts"
            )
        for theirs, ours in SOL_RL_KEYS.items():
            if theirs not in data:
                continue
            value = data.pop(theirs)
            if ours in data and data[ours] != value:
                raise ValueError(
                    f"{TABLE}.{theirs} = {value!r} (Sol-RL's name) and {TABLE}.{ours} = {data[ours]!r} "
                    f"name the same setting with different values; keep one of them"
                )
            data[ours] = value
        if data.get("fullrollout_model") == "compile_nvfp4":
            raise ValueError(
                f"{TABLE}.fullrollout_model = 'compile_nvfp4' (Sol-RL's naive-quant baseline) is not supported: "
                f"full rollouts are what the policy trains on and run in its precision; use "
                f"preview_model = 'compile_nvfp4' for NVFP4 drafts"
            )
        if data.get("preview_model") in SOL_RL_MODELS:
            data["preview_model"] = SOL_RL_MODELS[data["preview_model"]]
        return data

    def check_rollout(self, n_generation: int) -> None:
        """The rules across tables: ``k = [rollout] n_generation`` in ``[1, num_drafts]``, and
        Sol-RL's ``full_rollout_num``, when given, equal to it."""
        if self.full_rollout_num is not None and self.full_rollout_num != n_generation:
            raise ValueError(
                f"{TABLE}.full_rollout_num = {self.full_rollout_num} (Sol-RL's name) and [rollout] n_generation = "
                f"{n_generation} are the same setting (seeds regenerated per prompt) with different values; "
                f"set n_generation = {self.full_rollout_num} or drop full_rollout_num"
            )
        if not 1 <= n_generation <= self.num_drafts:
            raise ValueError(
                f"[rollout] n_generation = {n_generation} (the seeds regenerated per prompt) must be in "
                f"[1, {TABLE}.num_drafts = {self.num_drafts}]"
            )
