"""The RL training step shared by Diffusion-NFT, Flow-GRPO and DDRL.

cosmos-rl's colocated loop hands ``step_training`` the step's rollouts (one per sample,
``extra_info`` as written by :mod:`~cosmos_sana_plugins.rollout.rollout`). One step:

1. collate; advantages per prompt group over the rollouts of every data-parallel rank
   (``[policy.diffusers.sample] global_std``, see :mod:`~cosmos_sana_plugins.trainers.advantages`),
   clipped to ``[train.train_policy] advantage_low/high``;
2. ``mu_iterations`` passes; each shuffles the samples, splits them into optimizer batches
   (``batch_size_per_optimize``) of mini-batches (``mini_batch``) and, per sample, trains on
   ``K = int(num_steps · timesteps_fraction)`` (≥ 1) steps of its own σ grid, drawn at random;
3. gradients are the mean over the optimizer batch and the K steps (under FSDP2 reduced over the
   ranks in the batch's last backward only, for LoRA by default: :meth:`SanaTrainer.backward`); one
   optimizer step per optimizer batch; after all of them a subclass hook (NFT: the ``old`` update).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from cosmos_sana.log import get_logger
from cosmos_sana.payload_prompt import parse_prompt
from cosmos_sana.settings import settings_of
from cosmos_sana.step_clock import STEP_CLOCK
from cosmos_sana_plugins.sana.text import TextConditioning
from cosmos_sana_plugins.trainers import advantages, rollout_link
from cosmos_sana_plugins.trainers.base import SanaTrainer
from cosmos_sana_plugins.trainers.guards import RolloutGuards
from cosmos_sana_plugins.trainers.policies import RLPolicies
from cosmos_sana_plugins.trainers.runlog import summarize

logger = get_logger(__name__)


@dataclass
class RolloutBatch:
    """The step's samples, stacked on the training device (fields: see the rollout module)."""

    prompts: list[str]
    group_ids: torch.Tensor  # [B] prompt index
    rewards: torch.Tensor  # [B]
    completions: torch.Tensor | None  # media [B, ...] in [0, 1]
    text: TextConditioning
    sigmas: torch.Tensor  # [B, N+1]
    x0: torch.Tensor  # [B, *latent] final latents
    trajectory: torch.Tensor | None  # [B, N+1, *latent] (stochastic samplers)
    log_probs: torch.Tensor | None  # [B, N]
    components: dict[str, list[float]]  # per reward term

    @property
    def size(self) -> int:
        return self.x0.shape[0]

    @property
    def num_steps(self) -> int:
        return self.sigmas.shape[1] - 1

    @classmethod
    def collate(cls, rollouts: list[Any], device: torch.device) -> RolloutBatch:
        if not rollouts:
            raise ValueError("no rollouts to train on")
        infos = [r.extra_info or {} for r in rollouts]
        missing = {"x0", "sigmas", "text_embeds", "text_mask"} - infos[0].keys()
        if missing:
            raise ValueError(
                f"rollout extra_info lacks {sorted(missing)}: use [rollout] backend = \"sana\" "
                "(its RolloutResult sets completion_trainable so cosmos-rl keeps extra_info)"
            )

        def stack(key: str) -> torch.Tensor | None:
            if infos[0].get(key) is None:
                return None
            return torch.stack([torch.as_tensor(info[key]) for info in infos]).to(device)

        components: dict[str, list[float]] = defaultdict(list)
        for r in rollouts:
            for name, value in (r.report_metrics or {}).items():
                if isinstance(value, (int, float)):
                    components[name].append(float(value))
        completions = [r.completion for r in rollouts]
        media = torch.stack([torch.as_tensor(c) for c in completions]) if torch.is_tensor(completions[0]) else None
        return cls(
            prompts=[parse_prompt(r.prompt, f"rollout {i}")[0] for i, r in enumerate(rollouts)],
            group_ids=torch.tensor([r.prompt_idx for r in rollouts], device=device),
            rewards=torch.tensor([float(r.reward) for r in rollouts], device=device),
            completions=media,
            text=TextConditioning(stack("text_embeds"), stack("text_mask")),
            sigmas=stack("sigmas").float(),
            x0=stack("x0").float(),
            trajectory=stack("trajectory"),
            log_probs=stack("log_probs"),
            components=dict(components),
        )


def training_steps(batch: int, num_steps: int, fraction: float) -> torch.Tensor:
    """``[batch, K]`` step indices, K = max(1, int(num_steps · fraction)): per sample the first K
    of a random permutation of ``range(num_steps)``."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"policy.diffusers.timesteps_fraction must be in (0, 1], got {fraction}")
    k = max(1, int(num_steps * fraction))
    return torch.stack([torch.randperm(num_steps)[:k] for _ in range(batch)])


class SanaRLTrainer(SanaTrainer):
    """Shared RL step; subclasses define :meth:`loss_terms` and their policies."""

    rollout_policy = "current"  # NFT: "old"
    needs_old = False
    #: the ``[custom.trainer]`` options this trainer reads; setting any other one is refused
    trainer_options: frozenset[str] = frozenset({"on_non_finite", "advantage_std_ddof"})

    @classmethod
    def check_config(cls, config: Any) -> None:
        super().check_config(config)
        unread = sorted(settings_of(config).trainer.model_fields_set - cls.trainer_options)
        if unread:
            raise ValueError(
                f"custom.trainer.{unread[0]}: trainer_type {config.train.train_policy.trainer_type!r} does not use "
                f"this option (its options: {', '.join(sorted(cls.trainer_options))})"
            )
        best_of_n = settings_of(config).rollout.best_of_n
        if best_of_n is not None:
            best_of_n.check_rollout(config.rollout.n_generation)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tp = self.config.train.train_policy
        self.policies = RLPolicies(
            self.model,
            keep_old=self.needs_old,
            keep_reference=tp.kl_beta > 0,
            rollout_policy=self.rollout_policy,
            evaluation_weights=self.ema_weights,
        )
        # the colocated rollout samples the model through this link
        rollout_link.attach(self.model, rollout_link.TrainerLink(self.policies))
        self.guards = RolloutGuards(self.settings.guards, self.device)

    # ------------------------------------------------------------------ subclass API
    def loss_terms(self, batch: RolloutBatch, index: torch.Tensor, step: torch.Tensor, adv: torch.Tensor) -> dict[str, torch.Tensor]:
        """Losses of samples ``index`` at their grid steps ``step``; ``"loss"`` is back-propagated."""
        raise NotImplementedError

    def after_training_step(self, current_step: int) -> None:
        """Hook once the step's updates are done."""

    def transform_advantages(self, adv: torch.Tensor) -> torch.Tensor:
        """Hook between normalisation and the ``advantage_low/high`` clip (DDRL: ``exp_reward``)."""
        return adv

    def step_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Per-prompt advantages over the rollouts of every data-parallel rank (this rank's rows),
        transformed, then clipped to ``[train.train_policy] advantage_low/high``."""
        tp = self.config.train.train_policy
        adv = advantages.step_advantages(
            batch.rewards,
            batch.group_ids,
            global_std=self.config.policy.diffusers.sample.global_std,
            ddof=self.settings.trainer.advantage_std_ddof,
            group=advantages.data_parallel_group(self.parallel_dims),
        )
        return self.transform_advantages(adv).clamp(tp.advantage_low, tp.advantage_high)

    # ------------------------------------------------------------------ cosmos-rl API
    def weight_resume(self) -> dict[str, Any]:
        """cosmos-rl's colocated start: resume from DCP when ``train.resume`` asks for it."""
        info = self.model_resume_from_checkpoint()
        self.policies.completed_steps = self.train_step
        self.model.transformer.train()
        return info

    optional_parts = frozenset({"guards"})  # written only while a [custom.guards] threshold is set

    def checkpoint_parts(self) -> dict[str, Any]:
        guards = {"guards": self.guards} if self.guards.thresholds else {}
        return {**super().checkpoint_parts(), **self.policies.checkpoint_parts(), **guards}

    def step_validation(self, *args: Any, **kwargs: Any) -> None:
        """RL validation runs on the rollout side (``[validation]`` rewards)."""

    def step_training(
        self,
        rollouts: list[Any],
        current_step: int,
        total_steps: int,
        remain_samples_num: int = 0,
        inter_policy_nccl: Any = None,
        is_master_replica: bool = True,
        do_save_checkpoint: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        started = STEP_CLOCK.now()
        self.seed_step(current_step)
        self.ensure_lr_schedulers(total_steps)
        cfg, tp = self.config.policy.diffusers, self.config.train.train_policy
        batch = RolloutBatch.collate(rollouts, self.device)
        guard_metrics = self.guards.measure(batch.completions)
        tripped = self.guards.check(guard_metrics, current_step)
        if tripped is not None:  # stop before the step trains or saves anything
            self.run_log.log(current_step, {**summarize("reward", batch.rewards.tolist()), **guard_metrics}, total_steps)
            raise tripped
        adv = self.step_advantages(batch)
        per_opt = min(tp.batch_size_per_optimize or batch.size, batch.size)
        mini = min(tp.mini_batch or per_opt, per_opt)
        # loss terms stay on the device until the step ends: no host sync per micro-batch
        sums: dict[str, torch.Tensor] = {}
        losses_seen: list[torch.Tensor] = []
        count, grad_norms = 0, []
        self.model.transformer.train()
        with torch.enable_grad():
            for _ in range(tp.mu_iterations):
                order = torch.randperm(batch.size)
                steps = training_steps(batch.size, batch.num_steps, cfg.timesteps_fraction).to(self.device)
                for start in range(0, batch.size, per_opt):
                    opt_index = order[start : start + per_opt]
                    for m in range(0, len(opt_index), mini):
                        index = opt_index[m : m + mini].to(self.device)
                        for j in range(steps.shape[1]):
                            terms = self.loss_terms(batch, index, steps[index, j], adv[index])
                            weight = len(index) / len(opt_index) / steps.shape[1]
                            last = m + mini >= len(opt_index) and j == steps.shape[1] - 1
                            self.backward(terms["loss"] * weight, last=last)
                            for name, value in terms.items():
                                sums[name] = sums.get(name, 0) + value.detach() * len(index)
                            losses_seen.append(terms["loss"].detach())
                            count += len(index)
                    grad_norms.append(self.optimizer_step(inter_policy_nccl, step=current_step, losses=sums))
                    self.policies.current_changed()
        loss_max = float(torch.stack(losses_seen).max())
        self.after_training_step(current_step)
        self.lr_schedulers.step()
        self.train_step = self.policies.completed_steps = current_step
        replicas = self.config.policy.parallelism.n_init_replicas
        self.consumed_prompts += len(rollouts) // self.config.rollout.n_generation * replicas
        report = {f"train/{name}": float(total) / count for name, total in sums.items()}
        report.update(self.report_common(started, sum(grad_norms) / len(grad_norms)))
        # the keys cosmos-rl's controller aggregates in every colocated train report
        report.update({"train/loss_avg": report["train/loss"], "train/loss_max": loss_max})
        report["train/grad_norm"] = report["optimizer/grad_norm"]
        report.update(summarize("reward", batch.rewards.tolist()))
        report.update(guard_metrics)
        for name, values in batch.components.items():
            report.update(summarize(f"reward/{name}", values))
        report["train/advantage_abs_mean"] = adv.abs().mean().item()
        STEP_CLOCK.add("train", started)
        report.update(STEP_CLOCK.close_step())
        if self.device.type == "cuda":  # this rank's peak over the whole step (rollout included)
            report["memory/peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            torch.cuda.reset_peak_memory_stats(self.device)
        self.run_log.log(current_step, report, total_steps)
        interval = self.config.logging.multi_modal_log_interval
        if batch.completions is not None and interval and (current_step % interval == 0 or current_step == 1):
            captions = [f"{p} | r={r:.4g}" for p, r in zip(batch.prompts, batch.rewards.tolist())]
            self.run_log.media(current_step, "rollout", batch.completions, captions)
        if is_master_replica and do_save_checkpoint:
            self.save_checkpoint(current_step, total_steps, remain_samples_num, is_final=current_step == total_steps)
        return {"train_step": current_step, **report}

    def save_checkpoint(
        self, current_step: int, total_steps: int, remain_samples_num: int, *, is_final: bool
    ) -> None:
        """cosmos-rl API: DCP checkpoint; with the final one (or ``export_safetensors``) an export."""
        self.remain_samples_num = remain_samples_num
        self.save_training_state(current_step)
        if is_final or self.config.train.ckpt.export_safetensors:
            self.export_safetensors(str(self.output_dir), f"safetensors/step_{current_step}", is_final=is_final)
