"""Train any recipe in one process: what ``cosmos-sana run RECIPE --local`` and ``demo`` run.

The same registered model, trainer, rollout, rewards, datasets and checkpoint code as a
cosmos-rl launch, without its controller, Redis or NCCL (one CPU or one GPU). The launch's
drivers are stood in for as follows:

* RL (cosmos-rl's colocated loop): prompts come from the sampler cosmos-sana's controller uses
  (:func:`~cosmos_sana.checkpoint.controller_resume.controller_resume_kwargs`; epochs count from
  1), ``train_batch_per_replica / n_generation`` prompts a step, one ``rollout_generation`` with
  ``current_weight_version`` = completed steps, scoring by the reward function cosmos-rl gets
  (called as cosmos-rl calls it), per-sample ``Rollout`` objects by cosmos-rl's own
  ``extract_rollouts``, then ``step_training`` with ``do_save_checkpoint`` every
  ``train.ckpt.save_freq`` steps and at the last one. Steps: prompts × n_generation × epochs /
  train_batch_per_replica, capped by ``train.max_num_steps``.
* SFT (cosmos-rl's SFT worker): a ``DistributedSampler`` (``dataloader_shuffle``,
  ``dataloader_seed``, ``dataloader_drop_last``, ``set_epoch`` per epoch from 0) cut into
  ``train_batch_per_replica`` batches; ``step_training``, validation every ``validation.freq``
  steps and at the end, ``checkpointing`` after each step. Steps: batches × epochs, capped by
  ``train.max_num_steps``.

``train.resume`` is honoured as in a launch: the trainer restores the checkpoint when it is
built, and the data stream continues where the restored counters say (RL: the prompts behind
the completed steps, :func:`~cosmos_sana.checkpoint.controller_resume.stream_position`; SFT: the
step's epoch and batch). ``[validation]`` of RL recipes runs on a launch's rollout side only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from cosmos_sana.log import get_logger

logger = get_logger(__name__)

#: the data packer a launch gets (see :mod:`cosmos_sana.bridge`)
DATA_PACKER = "sana"


def is_sft(config: Any) -> bool:
    return config.train.train_policy.type == "sft"


def build_components(config: Any) -> tuple[Any, Any]:
    """``(trainer, rollout)`` as cosmos-rl's workers build them (one rank), restored from the
    checkpoint ``train.resume`` selects; ``rollout`` is None for SFT."""
    from cosmos_rl.policy.trainer.base import TrainerRegistry
    from cosmos_rl.rollout.rollout_base import RolloutRegistry
    from cosmos_rl.utils.parallelism import ParallelDims

    from cosmos_sana.compat.cosmos_rl import DIFFUSERS_SFT_PREFIX, register_all
    from cosmos_sana.plugin_manager import installed_plugins

    registry = installed_plugins()
    register_all(registry)
    packer = registry.get("data_packer", DATA_PACKER).load()()
    packer.setup(config)
    key = config.train.train_policy.trainer_type
    if is_sft(config):
        key = DIFFUSERS_SFT_PREFIX + key  # cosmos-rl's SFT worker looks diffusers trainers up so
    trainer = TrainerRegistry.get_trainer_cls(key)(
        config, ParallelDims.from_config(config.policy.parallelism), data_packer=packer, val_data_packer=packer
    )
    if is_sft(config):
        trainer.load_model()
        return trainer, None
    rollout = RolloutRegistry.get_rollout_cls(config.rollout.backend)(
        config, ParallelDims.from_config(config.rollout.parallelism), trainer.device
    )
    rollout.init_engine(None, config.rollout.seed, "auto")  # what cosmos-rl's rollout worker passes
    rollout.set_underlying_model(trainer.model)
    trainer.weight_resume()
    return trainer, rollout


def recipe_dataset(config: Any, field: str = "data") -> Any:
    """The dataset ``[custom.<field>]`` names (data, val_data), refused when missing or empty."""
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory

    dataset = dataset_factory(installed_plugins(), field)(config)
    if dataset is None:
        raise ValueError(f"custom.{field}: the recipe names no dataset")
    if len(dataset) == 0:
        raise ValueError(f"custom.{field}: the dataset is empty")
    return dataset


def capped(steps: int, config: Any) -> int:
    """``steps``, at most ``train.max_num_steps`` when that is set."""
    cap = config.train.max_num_steps
    return min(steps, cap) if cap is not None and cap > 0 else steps


# ---------------------------------------------------------------------------------------- RL
def rl_total_steps(config: Any, dataset_size: int) -> int:
    """cosmos-rl's colocated controller: every prompt ``n_generation`` times per epoch."""
    completions = dataset_size * config.rollout.n_generation * config.train.epoch
    return capped(completions // config.train.train_batch_per_replica, config)


def prompt_stream(config: Any, dataset: Any, consumed_prompts: int) -> Iterator[Any]:
    """The controller's prompts (``RLPayload``, ``prompt_idx`` = dataset index) after the first
    ``consumed_prompts``, epoch after epoch."""
    from cosmos_rl.dispatcher.data.schema import RLPayload

    from cosmos_sana.checkpoint.controller_resume import controller_resume_kwargs, stream_position

    tp = config.train.train_policy
    sampler = controller_resume_kwargs(config)["sampler"](dataset, shuffle=tp.dataloader_shuffle)
    epoch, position = stream_position(consumed_prompts, len(dataset))
    sampler.load_state_dict({"seed": tp.dataloader_seed, "epoch": epoch, "position": position})
    while True:
        for index in sampler:
            yield RLPayload(prompt=dataset[index], prompt_idx=index)
        sampler.set_epoch(sampler.epoch + 1)


def score_payload(reward_fn: Any, payload: Any, config: Any) -> tuple[list[float], list[dict[str, float]]]:
    """``(rewards, components)`` of a payload's completions, called the way cosmos-rl's
    ``Reward`` calls a reward function (once per group or once per completion)."""
    kwargs = {"prompt": payload.prompt, "config": config}
    if config.train.train_policy.group_reward_calculation:
        return reward_fn(payload.completions, payload.reference_answer, **kwargs)
    pairs = [reward_fn(c, payload.reference_answer, **kwargs) for c in payload.completions]
    return [total for total, _ in pairs], [parts for _, parts in pairs]


def save_due(config: Any, step: int, total: int) -> bool:
    """cosmos-rl's rule: every ``train.ckpt.save_freq`` steps and at the last step."""
    ckpt = config.train.ckpt
    return ckpt.enable_checkpoint and (step == total or (ckpt.save_freq > 0 and step % ckpt.save_freq == 0))


def run_rl(config: Any, trainer: Any, rollout: Any, dataset: Any, total: int) -> list[dict[str, Any]]:
    from cosmos_rl.utils.payload import extract_rollouts

    from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn

    n = config.rollout.n_generation
    if config.train.train_batch_per_replica % n:
        raise ValueError(f"train.train_batch_per_replica must be a multiple of rollout.n_generation ({n})")
    per_step = config.train.train_batch_per_replica // n
    if config.validation.enable:
        logger.warning("[validation] of an RL recipe runs on a launch's rollout side; this local run skips it")
    reward_fn = CosmosRewardFn(rollout.registry)
    prompts = prompt_stream(config, dataset, trainer.consumed_prompts)
    reports = []
    for step in range(trainer.train_step + 1, total + 1):
        payloads = [next(prompts) for _ in range(per_step)]
        rollouts = []
        results = rollout.rollout_generation(payloads, None, None, None, current_weight_version=step - 1)
        for payload, result in zip(payloads, results):
            payload.completions, payload.extra_info = result.completions, result.extra_info
            payload.rewards, payload.report_metrics = score_payload(reward_fn, payload, config)
            payload.advantages, payload.filter_rewards = [0.0] * n, [0.0] * n
            rollouts += extract_rollouts([payload], False)[0]
        reports.append(
            trainer.step_training(rollouts, step, total, do_save_checkpoint=save_due(config, step, total))
        )
    return reports


# ---------------------------------------------------------------------------------------- SFT
def sft_steps_per_epoch(config: Any, dataset_size: int) -> int:
    """Batches an epoch; a dataset too small for one batch is refused."""
    batch = config.train.train_batch_per_replica
    drop = config.train.train_policy.dataloader_drop_last
    steps = dataset_size // batch if drop else math.ceil(dataset_size / batch)
    if steps < 1:
        raise ValueError(
            f"custom.data: {dataset_size} samples make no batch of train.train_batch_per_replica = {batch} "
            "with train.train_policy.dataloader_drop_last = true"
        )
    return steps


def sft_batches(config: Any, dataset: Any, packer: Any, epoch: int, skip: int) -> Iterator[list[Any]]:
    """Epoch ``epoch``'s batches (processed items) after the first ``skip``, as cosmos-rl's SFT
    worker's loader yields them."""
    from torch.utils.data import DistributedSampler

    tp = config.train.train_policy
    sampler = DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=tp.dataloader_shuffle, seed=tp.dataloader_seed,
        drop_last=tp.dataloader_drop_last,
    )
    sampler.set_epoch(epoch)
    order, size = list(sampler), config.train.train_batch_per_replica
    for start in range(skip * size, len(order), size):
        indices = order[start : start + size]
        if len(indices) < size and tp.dataloader_drop_last:
            return
        yield [packer.sft_process_sample(dataset[i]) for i in indices]


def validate_sft(config: Any, trainer: Any, dataset: Any, step: int, total: int, *, last: bool) -> None:
    """cosmos-rl's SFT validation rounds: every ``validation.freq`` steps and at the end."""
    val = config.validation
    due = (step == 0 and val.val_before_train) or (step > 0 and step % val.freq == 0) or last
    if not (val.enable and due):
        return
    size = val.batch_size or config.train.train_batch_per_replica
    packer = trainer.val_data_packer
    for start in range(0, len(dataset), size):
        indices = range(start, min(start + size, len(dataset)))
        trainer.step_validation([packer.sft_process_sample(dataset[i]) for i in indices], step, total)


def run_sft(config: Any, trainer: Any, dataset: Any, total: int) -> list[dict[str, Any]]:
    val_dataset = recipe_dataset(config, "val_data") if config.validation.enable else None
    per_epoch = sft_steps_per_epoch(config, len(dataset))
    save_freq = config.train.ckpt.save_freq
    step, reports = trainer.train_step, []
    validate_sft(config, trainer, val_dataset, step, total, last=False)
    first_epoch = step // per_epoch
    for epoch in range(first_epoch, config.train.epoch):
        if step >= total:
            break
        skip = step % per_epoch if epoch == first_epoch else 0  # a resume mid-epoch
        for batch in sft_batches(config, dataset, trainer.data_packer, epoch, skip):
            reports.append(trainer.step_training(batch, total_steps=total, train_step=step, save_freq=save_freq))
            step += 1
            if step >= total:
                break
            validate_sft(config, trainer, val_dataset, step, total, last=False)
            trainer.checkpointing(total_steps=total, train_step=step, save_freq=save_freq)
    validate_sft(config, trainer, val_dataset, step, total, last=True)
    trainer.checkpointing(total_steps=total, train_step=step, save_freq=save_freq, is_last_step=True)
    return reports


# ---------------------------------------------------------------------------------------- both
def total_steps(config: Any, dataset: Any) -> int:
    """The run's last step, as cosmos-rl computes it for ``dataset``."""
    size = len(dataset)
    if is_sft(config):
        return capped(sft_steps_per_epoch(config, size) * config.train.epoch, config)
    return rl_total_steps(config, size)


def train_local(
    config: Any, components: tuple[Any, Any] | None = None, *, steps: int | None = None, dataset: Any = None
) -> list[dict[str, Any]]:
    """Train from the restored step (0 on a fresh start) to the recipe's last step (or ``steps``);
    returns each step's report. Checkpoints and ``logs/metrics.jsonl`` go under
    ``train.output_dir`` exactly as in a launch. ``dataset``: ``[custom.data]`` when already built."""
    trainer, rollout = components or build_components(config)
    dataset = dataset if dataset is not None else recipe_dataset(config)
    total = steps if steps is not None else total_steps(config, dataset)
    if trainer.train_step >= total:
        logger.info("nothing to train: the restored step %d is already the last (%d)", trainer.train_step, total)
        return []
    try:
        if is_sft(config):
            return run_sft(config, trainer, dataset, total)
        return run_rl(config, trainer, rollout, dataset, total)
    finally:
        trainer.run_log.close()
