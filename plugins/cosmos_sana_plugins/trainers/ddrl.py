"""DDRL (arXiv 2512.04332): Flow-GRPO's clipped policy term plus ``data_beta`` × the
flow-matching loss on real data, which replaces the reverse-KL penalty.

Real data is ``[custom.real_data]`` (an ``images``/``videos`` dataset) read in random order
for ever; each loss evaluation draws ``[custom.trainer] real_batch_size`` samples (default
``train_policy.mini_batch``). Its position is part of the checkpoint (``real_data``), so a
resumed run reads on where the interrupted one stopped. ``kl_beta`` must be 0. ``[custom.trainer] exp_reward = true``
maps each advantage A to −exp(−A) before the ``advantage_low/high`` clip, as cosmos-rl's WFM
DDRL does with its ``exp_reward`` (off by default there and here).
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import torch

from cosmos_sana.settings import settings_of
from cosmos_sana_plugins.trainers.flow_matching import encode_items, flow_matching_per_sample
from cosmos_sana_plugins.trainers import losses
from cosmos_sana_plugins.trainers.grpo import SanaFlowGRPOTrainer
from cosmos_sana_plugins.trainers.rl import RolloutBatch


class RealBatches:
    """Shuffled batches of dataset items, epoch after epoch (a new order each epoch; an epoch's
    last batch may be smaller). The order depends only on ``(seed, epoch)``; the sampler's epoch
    and position are the whole state a checkpoint needs."""

    def __init__(self, dataset: Any, batch_size: int, seed: int):
        from cosmos_sana.sample_order import EpochSampler

        self.dataset, self.batch_size = dataset, batch_size
        self.sampler = EpochSampler(dataset, seed=seed)

    def __iter__(self) -> RealBatches:
        return self

    def __next__(self) -> list[Any]:
        if self.sampler.position >= len(self.sampler):
            self.sampler.set_epoch(self.sampler.epoch + 1)
        return [self.dataset[i] for i in islice(iter(self.sampler), self.batch_size)]

    def state_dict(self) -> dict[str, int]:
        """Epoch and position only. Every rank reads batches of one size from the whole dataset,
        so they are equal on all ranks, and DCP keeps one copy of a plain value saved under the
        same key by several ranks; the seed is each rank's own (``train.seed`` + rank), so a stored
        one would come back as rank 0's on every rank."""
        return {"epoch": self.sampler.epoch, "position": self.sampler.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.epoch, self.sampler.position = int(state["epoch"]), int(state["position"])


class SanaDDRLTrainer(SanaFlowGRPOTrainer):
    # no KL term (kl_beta = 0), so no kl_form
    trainer_options = (SanaFlowGRPOTrainer.trainer_options - {"kl_form"}) | {"exp_reward", "data_beta", "real_batch_size"}

    @classmethod
    def check_config(cls, config: Any) -> None:
        super().check_config(config)
        if config.train.train_policy.kl_beta != 0:
            raise ValueError(
                f"train.train_policy.kl_beta = {config.train.train_policy.kl_beta}: DDRL replaces the KL penalty "
                "with custom.trainer.data_beta × the flow-matching loss on real data; set kl_beta = 0"
            )
        if settings_of(config).real_data is None:
            raise ValueError("custom.real_data: DDRL needs a real-data dataset (an images or videos dataset)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from cosmos_sana.plugin_manager import installed_plugins
        from cosmos_sana.runtime import dataset_factory

        dataset = dataset_factory(installed_plugins(), "real_data")(self.config)
        size = self.settings.trainer.real_batch_size or self.config.train.train_policy.mini_batch
        self.real_batches = RealBatches(dataset, size, (self.config.train.seed or 0) + self.global_rank)

    def checkpoint_parts(self) -> dict[str, Any]:
        return {**super().checkpoint_parts(), "real_data": self.real_batches}

    def transform_advantages(self, adv: torch.Tensor) -> torch.Tensor:
        return losses.negative_exp_advantage(adv) if self.settings.trainer.exp_reward else adv

    def loss_terms(
        self, batch: RolloutBatch, index: torch.Tensor, step: torch.Tensor, adv: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch, index, step, adv)
        latents, text = encode_items(self.model, next(self.real_batches))
        terms["data_loss"] = flow_matching_per_sample(self.model, latents, text).mean()
        terms["loss"] = terms["loss"] + self.settings.trainer.data_beta * terms["data_loss"]
        return terms
