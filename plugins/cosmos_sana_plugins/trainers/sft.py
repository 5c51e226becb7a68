"""Supervised fine-tuning of SANA / SANA-Video (full or LoRA) with the flow-matching loss.

cosmos-rl's SFT worker looks trainers up as ``"diffusers_" + trainer_type``: recipes set
``[train.train_policy] trainer_type = "sana_sft"``. Each step splits the global batch into
``mini_batch`` micro-batches whose gradients are *averaged* (each micro-batch's summed
per-sample loss is divided by the global batch size) and logs the mean loss. EMA
(``[train] ema_enable``) is updated after each optimizer step and used for validation and
export. Validation renders ``[custom.val_data]`` prompts (fixed seeds, ODE sampler,
``eval_num_steps``) to PNG/MP4 under ``logs/media/validation``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from cosmos_sana_plugins.trainers.base import SanaTrainer
from cosmos_sana_plugins.trainers.flow_matching import encode_items, flow_matching_per_sample


class SanaSFTTrainer(SanaTrainer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rendered: dict[int, int] = {}  # validation samples rendered per train step

    # ------------------------------------------------------------------ cosmos-rl SFT worker API
    def load_model(self) -> tuple[int, int, dict[str, Any]]:
        """``(checkpoint total steps, step to continue from, extra)``; resumes per ``train.resume``."""
        info = self.model_resume_from_checkpoint()
        return 0, self.train_step, info

    def step_training(
        self,
        global_batch: Any,
        total_steps: int,
        train_step: int,
        save_freq: int,
        inter_policy_nccl: Any = None,
        data_arrival_event: Any = None,
    ) -> dict[str, Any]:
        started = time.perf_counter()
        self.seed_step(train_step + 1)
        self.ensure_lr_schedulers(total_steps)
        self.model.transformer.train()
        packer, mini = self.data_packer, self.config.train.train_policy.mini_batch
        size = packer.batch_size(global_batch)
        losses = []
        for start in range(0, size, mini):
            batch = packer.sft_collate_fn(packer.slice_batch(global_batch, start, start + mini))
            latents, text = encode_items(self.model, batch["samples"])
            per_sample = flow_matching_per_sample(self.model, latents, text)
            self.backward(per_sample.sum() / size, last=start + mini >= size)
            losses.append(per_sample.detach())
        grad_norm = self.optimizer_step(inter_policy_nccl, step=train_step + 1, losses={"loss": torch.cat(losses)})
        self.lr_schedulers.step()
        self.train_step = train_step + 1
        per_sample = torch.cat(losses)
        report = {"train/loss_avg": per_sample.mean().item(), "train/loss_max": per_sample.max().item()}
        report.update(self.report_common(started, grad_norm))
        self.run_log.log(self.train_step, {"train/loss": report["train/loss_avg"], **report}, total_steps)
        return report

    @torch.no_grad()
    def step_validation(self, val_global_batch: Any, train_step: int, total_steps: int) -> float:
        """Render the batch's prompts with the EMA weights (when on); returns 0 (no validation loss)."""
        from cosmos_sana_plugins.sana.sampling import generators_for, sample, sampler_settings

        if not self.config.validation.enable:  # every rank samples (FSDP); rank 0 writes
            return 0.0
        done = self._rendered.get(train_step, 0)
        budget = max(self.settings.trainer.val_max_samples - done, 0)
        requests = self.val_data_packer.sft_collate_fn(val_global_batch, is_validation=True)[:budget]
        if not requests:
            return 0.0
        self._rendered = {train_step: done + len(requests)}
        prompts = [r["prompt"] for r in requests]
        settings = sampler_settings(self.config, self.model, validation=True)
        seed = self.config.train.seed or 0
        with self.ema_weights():
            out = sample(self.model, self.model.encode_text(prompts),
                         generators_for([seed + i for i in range(len(prompts))], self.device), settings)
        self.run_log.media(train_step, "validation", out.media, prompts)
        return 0.0

    def checkpointing(
        self,
        total_steps: int,
        train_step: int,
        save_freq: int,
        is_last_step: bool = False,
        pp_last_stage: bool = False,
        val_score: float | None = None,
    ) -> None:
        """DCP checkpoint every ``save_freq`` steps and at the end; export at the end (and with
        ``train.ckpt.export_safetensors``)."""
        due = is_last_step or (train_step > 0 and train_step % save_freq == 0)
        if not (due and self.config.train.ckpt.enable_checkpoint):
            return
        self.save_training_state(train_step)
        if is_last_step or self.config.train.ckpt.export_safetensors:
            self.export_safetensors(str(self.output_dir), f"safetensors/step_{train_step}", is_final=is_last_step)
