"""Entry point of the built-in trainers plugin: SFT, Diffusion-NFT, Flow-GRPO and DDRL.

Recipes name a trainer by ``[train.train_policy] trainer_type`` (SFT: ``sana_sft``, which
cosmos-rl's SFT worker looks up as ``diffusers_sana_sft``).
"""

from __future__ import annotations

from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import TrainerSpec

_PKG = "cosmos_sana_plugins.trainers"


@hookimpl
def cosmos_sana_trainers() -> list[TrainerSpec]:
    return [
        TrainerSpec(
            name="sana_sft",
            trainer_type="diffusers_sana_sft",
            target=f"{_PKG}.sft:SanaSFTTrainer",
            description="SFT (full or LoRA): flow matching, logit-normal σ, averaged micro-batches, EMA",
        ),
        TrainerSpec(
            name="sana_nft",
            trainer_type="sana_nft",
            target=f"{_PKG}.nft:SanaNFTTrainer",
            description="Diffusion-NFT (LoRA or full): implicit ±policies, adaptive weights, old-policy decay",
        ),
        TrainerSpec(
            name="sana_flow_grpo",
            trainer_type="sana_flow_grpo",
            target=f"{_PKG}.grpo:SanaFlowGRPOTrainer",
            description="Flow-GRPO: SDE rollouts, clipped ratio, KL to the base model",
        ),
        TrainerSpec(
            name="sana_ddrl",
            trainer_type="sana_ddrl",
            target=f"{_PKG}.ddrl:SanaDDRLTrainer",
            description="DDRL: Flow-GRPO policy term + data_beta × flow matching on [custom.real_data]",
        ),
    ]
