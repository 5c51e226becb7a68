"""A single-process stand-in for cosmos-rl's colocated RL loop (CPU debugging, tests, demos).

Same components as a real run — the registered trainer and ``sana`` rollout classes, the
``[custom.data]`` prompts, the ``[[custom.rewards]]`` scorers and cosmos-rl's own
``extract_rollouts`` — without the controller, redis or NCCL that a launch needs. Per
step: ``train_batch_per_replica / n_generation`` prompts in dataset order, one rollout,
scoring by the reward function cosmos-rl gets (called as cosmos-rl calls it, so
``[custom.reward_runtime] mode = "async"`` collects what the rollout submitted), per-sample
``Rollout`` objects, one ``step_training``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def build_components(config: Any) -> tuple[Any, Any]:
    """``(trainer, rollout)`` as cosmos-rl's colocated workers build them (single rank)."""
    from cosmos_rl.policy.trainer.base import TrainerRegistry
    from cosmos_rl.rollout.rollout_base import RolloutRegistry
    from cosmos_rl.utils.parallelism import ParallelDims

    from cosmos_sana.compat.cosmos_rl import register_all
    from cosmos_sana.plugin_manager import installed_plugins

    registry = installed_plugins()
    register_all(registry)
    packer = registry.get("data_packer", "sana").load()()
    packer.setup(config)
    trainer = TrainerRegistry.get_trainer_cls(config.train.train_policy.trainer_type)(
        config, ParallelDims.from_config(config.policy.parallelism), data_packer=packer, val_data_packer=packer
    )
    rollout = RolloutRegistry.get_rollout_cls(config.rollout.backend)(
        config, ParallelDims.from_config(config.rollout.parallelism), trainer.device
    )
    rollout.init_engine(None, config.train.seed or 0, "auto")
    rollout.set_underlying_model(trainer.model)
    trainer.weight_resume()
    return trainer, rollout


def _prompt_batches(config: Any, per_step: int) -> Iterator[list[Any]]:
    from cosmos_rl.dispatcher.data.schema import RLPayload

    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory

    dataset = dataset_factory(installed_plugins(), "data")(config)
    index = 0
    while True:
        batch = []
        for _ in range(per_step):
            batch.append(RLPayload(prompt=dataset[index % len(dataset)], prompt_idx=index))
            index += 1
        yield batch


def score_payload(reward_fn: Any, payload: Any, config: Any) -> tuple[list[float], list[dict[str, float]]]:
    """``(rewards, components)`` of a payload's completions, called the way cosmos-rl's
    ``Reward`` calls a reward function (once per group or once per completion)."""
    kwargs = {"prompt": payload.prompt, "config": config}
    if config.train.train_policy.group_reward_calculation:
        return reward_fn(payload.completions, payload.reference_answer, **kwargs)
    pairs = [reward_fn(c, payload.reference_answer, **kwargs) for c in payload.completions]
    return [total for total, _ in pairs], [parts for _, parts in pairs]


def run_local(config: Any, steps: int, components: tuple[Any, Any] | None = None) -> list[dict[str, Any]]:
    """Train ``steps`` steps; returns each step's report (``reward/mean`` etc.)."""
    from cosmos_rl.utils.payload import extract_rollouts

    from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn

    trainer, rollout = components or build_components(config)
    reward_fn = CosmosRewardFn(rollout.registry)
    n = config.rollout.n_generation
    if config.train.train_batch_per_replica % n:
        raise ValueError(f"train.train_batch_per_replica must be a multiple of rollout.n_generation ({n})")
    prompts = _prompt_batches(config, config.train.train_batch_per_replica // n)
    reports = []
    for step in range(1, steps + 1):
        payloads = next(prompts)
        rollouts = []
        for payload, result in zip(payloads, rollout.rollout_generation(payloads, None, None, None)):
            payload.completions, payload.extra_info = result.completions, result.extra_info
            payload.rewards, payload.report_metrics = score_payload(reward_fn, payload, config)
            payload.advantages, payload.filter_rewards = [0.0] * n, [0.0] * n
            rollouts += extract_rollouts([payload], False)[0]
        reports.append(trainer.step_training(rollouts, step, steps))
    return reports
