"""What every cosmos-sana trainer shares: model, optimizer, EMA, checkpoints, export, logging.

A subclass of cosmos-rl's ``Trainer`` (not of its ``DiffusersTrainer``, whose set-up hard-codes
CUDA, crashes with ``ema_enable`` and saves LoRA without the ``transformer.`` prefix).
The model comes from cosmos-rl's ``ModelRegistry`` (the SANA adapter), the optimizer and LR
schedule from cosmos-rl's ``build_optimizers`` / ``build_lr_schedulers`` (``[train] optm_*``),
checkpoints are cosmos-sana DCP (``cosmos_sana.checkpoint``) under ``train.output_dir``, exports
go through ``cosmos_sana.export`` (from those checkpoints, so sharded weights export the same way).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from cosmos_rl.policy.trainer.base import Trainer

from cosmos_sana.log import get_logger
from cosmos_sana.seeds import derive_seed, seed_all
from cosmos_sana.settings import settings_of
from cosmos_sana_plugins.trainers import data_parallel
from cosmos_sana_plugins.trainers.finite import NonFiniteStep, non_finite_problem
from cosmos_sana_plugins.trainers.runlog import run_log_for

logger = get_logger(__name__)


class SanaTrainer(Trainer):
    """Model, optimizer, LR schedule, EMA, DCP checkpoint and export for one policy replica."""

    def __init__(
        self,
        config: Any,
        parallel_dims: Any,
        train_stream: Any = None,
        data_packer: Any = None,
        val_data_packer: Any = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("device", None)  # cosmos-rl's RL worker passes its (CUDA) device; the model decides
        super().__init__(
            config, parallel_dims, train_stream, data_packer=data_packer, val_data_packer=val_data_packer, **kwargs
        )
        from cosmos_rl.policy.model import ModelRegistry

        self.check_config(config)
        self.settings = settings_of(config)
        if config.train.seed is not None:
            seed_all(config.train.seed)
        self.model = ModelRegistry.build_model(config)
        if self.settings.checkpoint.init_from:
            from cosmos_sana.checkpoint import load_model_weights

            load_model_weights(self.settings.checkpoint.init_from, self.model.transformer)
        self.device = self.model.current_device()
        self.is_lora = bool(self.model.lora_names)
        self.is_video = bool(self.model.is_video)
        # FSDP2 over dp_shard, or a whole replica per rank (needs the worker's mesh)
        self.gradient_group = data_parallel.place_model(
            self.model, parallel_dims, config, self.settings.model.lora_data_parallel
        )
        self.deferred_sync = data_parallel.deferred_sync_modules(
            self.model.transformer, self.settings.model.fsdp_gradient_sync, self.is_lora
        )
        self.model.set_gradient_checkpointing_enabled(config.policy.model_gradient_checkpointing)
        self.build_optimizers()
        self.lr_schedulers: Any = None
        self._schedule_steps: int | None = None  # total steps the schedule was built for
        self.ema = self._build_ema()
        self.run_log = run_log_for(config, rank=self.global_rank)
        self.train_step = 0  # completed training steps
        self.optimizer_updates = 0
        self.skipped_updates = 0  # optimizer updates dropped for non-finite values (on_non_finite = "skip")
        self.remain_samples_num = 0  # RL: completions the controller still had to hand out
        self.consumed_prompts = 0  # RL: prompts behind the completed steps (places the controller's stream on resume)

    # ------------------------------------------------------------------ config
    @classmethod
    def check_config(cls, config: Any) -> None:
        """Refuse settings this trainer cannot honour (raises ValueError naming the key)."""
        if config.train.ema_enable and not 0.0 <= config.train.ema_decay < 1.0:
            raise ValueError(f"train.ema_decay must be in [0, 1), got {config.train.ema_decay}")
        data_parallel.check_placement(config, settings_of(config).model.lora_data_parallel)

    # ------------------------------------------------------------------ optimisation
    def build_optimizers(self) -> None:
        from cosmos_rl.policy.trainer.optm import build_optimizers

        self.optimizers = build_optimizers(self.model.trained_model, self.config)

    def build_lr_schedulers(self, total_steps: int = 1) -> Any:
        from cosmos_rl.policy.trainer.optm import build_lr_schedulers

        return build_lr_schedulers(self.optimizers, self.config, max(total_steps, 1))

    def ensure_lr_schedulers(self, total_steps: int) -> None:
        """Built once the controller knows the number of steps (keeps a resumed schedule's state)."""
        if self._schedule_steps == total_steps:
            return
        schedulers = self.build_lr_schedulers(total_steps)
        if self.lr_schedulers is not None:
            schedulers.load_state_dict(self.lr_schedulers.state_dict())
        self.lr_schedulers, self._schedule_steps = schedulers, total_steps

    update_lr_schedulers = ensure_lr_schedulers  # the name cosmos-rl's RL worker calls

    @property
    def trainable_params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.transformer.parameters() if p.requires_grad]

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Back-propagate one micro-batch's ``loss``; ``last``: the optimizer step follows. FSDP2
        reduce-scatters the gradients in the last backward only, earlier ones accumulate them
        unsharded, when ``[custom.model] fsdp_gradient_sync`` defers (LoRA by default; see
        :func:`~cosmos_sana_plugins.trainers.data_parallel.deferred_sync_modules`)."""
        data_parallel.set_gradient_sync(self.deferred_sync, last)
        loss.backward()

    def optimizer_step(
        self, inter_policy_nccl: Any = None, *, step: int | None = None, losses: dict[str, Any] | None = None
    ) -> float:
        """Average gradients over the data-parallel replicas (``lora_data_parallel = "replicate"``; FSDP
        averages its shards in the backward) and over policy replicas, clip (``optm_grad_norm_clip``), step, zero; then the
        EMA update (every ``ema_update_step_interval`` optimizer updates).

        A non-finite gradient or loss term (``losses``, name → per-sample values) stops training
        before any weight changes, naming training step ``step`` (or, with ``[custom.trainer]
        on_non_finite = "skip"``, drops this update and counts it)."""
        params = self.trainable_params
        if self.gradient_group is not None:
            data_parallel.average_gradients(params, self.gradient_group)
        if inter_policy_nccl is not None:
            from cosmos_rl.utils.distributed import gradient_reduce_across_dp_replicas_

            gradient_reduce_across_dp_replicas_(params, inter_policy_nccl)
        # the norm is checked before clipping: clipping scales every gradient by max_norm / norm,
        # which is NaN for a NaN norm, and the parameter whose gradient was bad could not be named
        sharded_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
        norm = sharded_norm.full_tensor() if hasattr(sharded_norm, "full_tensor") else sharded_norm
        problem = non_finite_problem(norm, losses or {}, self.model.transformer.named_parameters())
        clip = self.config.train.optm_grad_norm_clip
        if problem is None and clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, clip, sharded_norm, foreach=True)
        if problem is not None:
            self.optimizers.zero_grad()
            if self.settings.trainer.on_non_finite == "stop":
                raise NonFiniteStep(
                    f"step {step}: {problem}; stopped before the optimizer step, no weight changed "
                    '(set [custom.trainer] on_non_finite = "skip" to skip such updates instead)'
                )
            self.skipped_updates += 1
            logger.warning("step %s: %s; optimizer update skipped (%d so far)", step, problem, self.skipped_updates)
            return float(norm)
        self.optimizers.step()
        self.optimizers.zero_grad()
        self.optimizer_updates += 1
        interval = self.config.train.ema_update_step_interval
        if self.ema is not None and (interval <= 1 or self.optimizer_updates % interval == 0):
            self.ema.update()
        return float(norm)

    # ------------------------------------------------------------------ EMA
    def _build_ema(self) -> Any:
        if not self.config.train.ema_enable:
            return None
        from cosmos_sana.checkpoint.ema import ParameterEMA

        return ParameterEMA(self.model.transformer, self.config.train.ema_decay)

    @contextlib.contextmanager
    def ema_weights(self) -> Iterator[None]:
        """Forward with the EMA weights inside the block (no-op without EMA).

        The swap writes the sharded weights: FSDP2 weights still gathered by gradient-free forwards
        (``train.fsdp_reshard_after_forward = "never"``) are freed before it and after the restore, so
        neither the EMA forwards nor the next training forward run on a stale gathered copy."""
        if self.ema is None:
            yield
            return
        data_parallel.reshard(self.model.transformer)
        params = dict(self.model.transformer.named_parameters())
        saved = {name: params[name].detach().clone() for name in self.ema.shadow}
        with torch.no_grad():
            for name, value in self.ema.shadow.items():
                params[name].copy_(value)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, value in saved.items():
                    params[name].copy_(value)
            data_parallel.reshard(self.model.transformer)

    # ------------------------------------------------------------------ checkpoints
    def seed_step(self, step: int) -> None:
        """Seed every generator for training step ``step`` from ``(train.seed, rank, step)`` alone.

        Whatever drew random numbers since the last step (a DataLoader starting an epoch,
        validation, a resume) cannot change what this step draws, so a resumed run trains each
        step exactly as the uninterrupted run did.
        """
        seed_all(derive_seed(self.config.train.seed or 0, "train", self.global_rank, step))

    @property
    def output_dir(self) -> Path:
        return Path(self.config.train.output_dir)

    #: parts a checkpoint may lack (the run that wrote it had no such state); they start fresh on resume
    optional_parts: frozenset[str] = frozenset()

    def checkpoint_parts(self) -> dict[str, Any]:
        """Named ``Stateful`` parts of a training checkpoint (subclasses add theirs)."""
        from cosmos_sana.checkpoint.controller_resume import TRAINER_PART, counter_tensors
        from cosmos_sana.checkpoint.states import ModelState, OptimizerState, RNGState

        transformer = self.model.transformer
        parts: dict[str, Any] = {
            "model": ModelState(transformer, lora_only=self.is_lora, base_pipeline=self.config.policy.model_name_or_path),
            "optim": OptimizerState(transformer, list(self.optimizers)),
            "rng": RNGState(self.config.train.seed or 0),
            TRAINER_PART: counter_tensors(self),
        }
        if self.lr_schedulers is not None:
            parts["scheduler"] = self.lr_schedulers
        if self.ema is not None:
            parts["ema"] = self.ema
        return parts

    def save_training_state(self, step: int) -> Path:
        from cosmos_sana.checkpoint import save_checkpoint

        self.train_step = step
        keep = self.config.train.ckpt.max_keep
        return save_checkpoint(
            self.output_dir,
            step,
            self.checkpoint_parts(),
            config=self.config,
            keep_last=keep if keep and keep > 0 else None,
            chunk_size=self.settings.checkpoint.chunk_size,
        )

    def model_resume_from_checkpoint(self) -> dict[str, Any]:
        """Restore the checkpoint ``train.resume`` names (or the latest); ``{}`` when there is none.

        Returns cosmos-rl's resume contract (``ControllerResumeMetadata.to_checkpoint_extra_info``),
        which the RL worker posts to the controller.
        """
        from cosmos_sana.checkpoint import load_checkpoint, resolve_resume, runs_root
        from cosmos_sana.checkpoint.controller_resume import TRAINER_PART, restore_counters
        from cosmos_sana.checkpoint.training import changed_settings, refuse_other_run

        path = resolve_resume(self.config.train.resume, runs_root(self.output_dir, self.config.train.timestamp))
        if path is None:
            return {}
        changed = changed_settings(path, self.config)
        refuse_other_run(path, changed)
        parts = self.checkpoint_parts()
        for name in self.optional_parts & set(parts):
            if not (path / name).is_dir():
                logger.info("%s: no %r part (the run that wrote it had none); it starts fresh", path, name)
                del parts[name]
        if "scheduler" not in parts:  # rebuild with the stored state, resized on the first step
            self.lr_schedulers = self.build_lr_schedulers()
            parts["scheduler"] = self.lr_schedulers
        load_checkpoint(path, parts)
        if changed:
            logger.warning(
                "resuming from %s with settings that differ from the run that wrote it (%s): the "
                "continuation will not match that run", path, ", ".join(changed),
            )
        restore_counters(self, parts[TRAINER_PART])
        return {
            "step": self.train_step,
            "optimizer_updates": self.optimizer_updates,
            "remain_samples_num": self.remain_samples_num,
            "checkpoint_path": str(path),
            "checkpoint_id": path.name,
            "controller_resume_schema_version": 1,
        }

    def model_load_from_hf(self) -> None:
        """Weights were loaded with the pipeline (and ``[custom.checkpoint] init_from``) at construction."""

    # ------------------------------------------------------------------ export
    def export_safetensors(
        self,
        output_dir: str,
        rel_path: str,
        trainable_only: bool = False,
        is_final: bool = False,
        dtype: torch.dtype | None = None,
    ) -> Path:
        """Export the checkpoint of the current step (already saved) with cosmos-sana's exporter, on rank 0:
        LoRA → ``pytorch_lora_weights.safetensors``, full → a pipeline folder; EMA weights when EMA is on."""
        from cosmos_sana.checkpoint import checkpoint_dir
        from cosmos_sana.export import export_checkpoint

        target = Path(output_dir) / rel_path
        if self.global_rank == 0:
            export_checkpoint(checkpoint_dir(self.output_dir, self.train_step), target, ema=self.ema is not None, dtype=dtype)
        return target

    # ------------------------------------------------------------------ helpers
    def report_common(self, started: float, grad_norm: float) -> dict[str, float]:
        return {
            "train/learning_rate": float(self.lr_schedulers.get_last_lr()[0]),
            "train/iteration_time": time.perf_counter() - started,
            "optimizer/grad_norm": grad_norm,
            "train/skipped_updates": float(self.skipped_updates),
        }
