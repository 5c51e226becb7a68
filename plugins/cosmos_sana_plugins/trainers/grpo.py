"""Flow-GRPO (Liu et al., 2025): clipped importance ratios of SDE steps, KL to the reference.

Rollouts sample the current policy with a stochastic sampler (``[custom.rollout] sampler =
"sde"`` or ``"cps"``) and store each step's log-prob; training recomputes the log-prob of
``K`` recorded steps per sample under the current weights (with the rollout's CFG) and
minimises ``mean(max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)))`` plus
``kl_beta · mean(‖μ_θ − μ_ref‖² / (2·std_dev_t²))``, flow_grpo's KL (``[custom.trainer]
kl_form``). With CFG the gradient also flows through the unconditional prediction unless
``[custom.trainer] cfg_uncond_grad = "detach"``. docs/algorithms.md compares both options
with flow_grpo's code.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_sana.settings import settings_of
from cosmos_sana_plugins.sana.sampling import GuidedDenoiser, step_log_prob
from cosmos_sana_plugins.trainers import losses
from cosmos_sana_plugins.trainers.rl import RolloutBatch, SanaRLTrainer


class SanaFlowGRPOTrainer(SanaRLTrainer):
    rollout_policy = "current"
    trainer_options = SanaRLTrainer.trainer_options | {"kl_form", "cfg_uncond_grad"}

    @classmethod
    def check_config(cls, config: Any) -> None:
        super().check_config(config)
        sampler = settings_of(config).rollout.sampler
        if sampler == "ode":
            raise ValueError(
                "custom.rollout.sampler = 'ode' takes deterministic steps without log-probs; "
                f"{cls.__name__} needs 'sde' or 'cps'"
            )
        if config.policy.diffusers.sample.noise_level <= 0:
            raise ValueError("policy.diffusers.sample.noise_level (the SDE η) must be > 0 for policy-gradient training")

    def step_log_prob(
        self, batch: RolloutBatch, index: torch.Tensor, step: torch.Tensor, model: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, mean, std)`` of the recorded steps ``step`` of samples ``index`` under ``model``
        (default: the trained policy), with the rollout's sampler, η and CFG."""
        sample_cfg = self.config.policy.diffusers.sample
        x, x_next = batch.trajectory[index, step], batch.trajectory[index, step + 1]
        sigma, sigma_next = batch.sigmas[index, step], batch.sigmas[index, step + 1]
        denoiser = GuidedDenoiser(
            model or self.model,
            batch.text.select(index),
            guidance_scale=sample_cfg.guidance_scale,
            detach_uncond=self.settings.trainer.cfg_uncond_grad == "detach",
        )
        sampler, eta = self.settings.rollout.sampler, float(sample_cfg.noise_level)
        return step_log_prob(sampler, denoiser(x, sigma), x, x_next, sigma, sigma_next, eta)

    def loss_terms(
        self, batch: RolloutBatch, index: torch.Tensor, step: torch.Tensor, adv: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        tp = self.config.train.train_policy
        log_prob, mean, std = self.step_log_prob(batch, index, step)
        policy, ratio = losses.grpo_clipped_loss(
            log_prob, batch.log_probs[index, step], adv, tp.epsilon_low, tp.epsilon_high
        )
        terms = {
            "policy_loss": policy,
            "ratio": ratio.mean().detach(),
            "clip_fraction": ((ratio < 1 - tp.epsilon_low) | (ratio > 1 + tp.epsilon_high)).float().mean(),
        }
        loss = policy
        if tp.kl_beta > 0:
            with torch.no_grad(), self.policies.view("reference") as reference:
                _, mean_ref, _ = self.step_log_prob(batch, index, step, reference)
            kl_std = losses.kl_std(
                self.settings.trainer.kl_form,
                self.settings.rollout.sampler,
                std,
                batch.sigmas[index, step],
                batch.sigmas[index, step + 1],
            )
            terms["kl_loss"] = losses.sde_kl(mean, mean_ref, kl_std).mean()
            loss = loss + tp.kl_beta * terms["kl_loss"]
        terms["loss"] = loss
        return terms
