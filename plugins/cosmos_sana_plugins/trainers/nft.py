"""Diffusion-NFT (Zheng et al., 2025), as Sol-RL trains SANA.

Rollouts sample with the ``old`` policy; training noises each rollout's final latents at
``K`` of its own grid σ and fits implicit positive/negative policies (see
:func:`~cosmos_sana_plugins.trainers.losses.nft_loss`); after the step
``old ← decay·old + (1 − decay)·current`` (``weight_copy_decay_type``). LoRA (``old`` is an
adapter) or full-parameter (``old`` is a frozen copy). The KL reference is the base model;
``kl_beta = 0`` drops it. Diffusion-NFT is CFG-free: ``guidance_scale > 1`` is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_sana_plugins.trainers import losses
from cosmos_sana_plugins.trainers.policies import OLD
from cosmos_sana_plugins.trainers.rl import RolloutBatch, SanaRLTrainer


class SanaNFTTrainer(SanaRLTrainer):
    rollout_policy = "old"
    needs_old = True

    @classmethod
    def check_config(cls, config: Any) -> None:
        super().check_config(config)
        cfg, tp = config.policy.diffusers, config.train.train_policy
        if cfg.sample.guidance_scale > 1.0:
            raise ValueError(
                f"policy.diffusers.sample.guidance_scale = {cfg.sample.guidance_scale}: Diffusion-NFT trains and "
                "samples without classifier-free guidance; set it to 1.0"
            )
        if cfg.nft_beta <= 0:
            raise ValueError(f"policy.diffusers.nft_beta must be > 0, got {cfg.nft_beta}")
        if tp.advantage_high <= 0:
            raise ValueError(f"train.train_policy.advantage_high (the NFT advantage clip) must be > 0, got {tp.advantage_high}")
        losses.weight_copy_decay(0, cfg.weight_copy_decay_type)  # rejects unknown types
        lora = config.policy.lora
        if lora is not None and OLD not in lora.lora_names:
            raise ValueError(
                f"policy.lora.lora_names = {lora.lora_names}: Diffusion-NFT keeps the old policy as a LoRA adapter "
                f"named {OLD!r}; add it, e.g. lora_names = [\"default\", \"{OLD}\"]"
            )

    def loss_terms(
        self, batch: RolloutBatch, index: torch.Tensor, step: torch.Tensor, adv: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        cfg, tp = self.config.policy.diffusers, self.config.train.train_policy
        x0 = batch.x0[index]
        sigma = batch.sigmas[index, step]
        xt = losses.noised(x0, torch.randn_like(x0), sigma)
        text = batch.text.select(index)
        v_old = self.policies.velocity("old", xt, sigma, text)
        v_ref = self.policies.velocity("reference", xt, sigma, text) if tp.kl_beta > 0 else None
        v_theta = self.model.velocity(xt, sigma, text)
        terms = losses.nft_loss(
            v_theta=v_theta,
            v_old=v_old,
            v_ref=v_ref,
            x0=x0,
            xt=xt,
            sigma=sigma,
            optimality=losses.nft_optimality(adv, tp.advantage_high),
            beta=cfg.nft_beta,
            adv_clip=tp.advantage_high,
            kl_beta=tp.kl_beta,
        )
        return {
            "loss": terms.loss,
            "policy_loss": terms.policy,
            "kl_loss": terms.kl,
            "positive_loss": terms.positive.mean(),
            "negative_loss": terms.negative.mean(),
            "old_deviation": ((v_theta.detach() - v_old) ** 2).mean(),
        }

    def after_training_step(self, current_step: int) -> None:
        decay = losses.weight_copy_decay(current_step, self.config.policy.diffusers.weight_copy_decay_type)
        self.policies.update_old(decay)
