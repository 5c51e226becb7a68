"""Trainers and rollouts built from the tiny recipes, the way cosmos-rl's workers build them."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

TOML_DIR = Path(__file__).resolve().parents[1] / "toml"


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *path, last = dotted.split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


def recipe(name: str, pipeline: Path, output_dir: Path, overrides: dict[str, Any] | None = None) -> Any:
    """cosmos-rl ``Config`` of ``toml/tiny/<name>.toml`` on ``pipeline``, writing to ``output_dir``;
    ``overrides`` maps dotted keys to values (None removes the key)."""
    from cosmos_sana.compat.cosmos_rl import cosmos_config_class

    with open(TOML_DIR / "tiny" / f"{name}.toml", "rb") as handle:
        data = tomllib.load(handle)
    set_key(data, "policy.model_name_or_path", str(pipeline))
    set_key(data, "train.output_dir", str(output_dir))
    set_key(data, "train.timestamp", "run")
    set_key(data, "custom.logging", {"progress_bar": False})
    set_key(data, "custom.model.device", "cpu")
    for key, value in (overrides or {}).items():
        if value is None:  # drop the key
            *path, last = key.split(".")
            node = data
            for part in path:
                node = node[part]
            node.pop(last, None)
        else:
            set_key(data, key, copy.deepcopy(value))
    return cosmos_config_class().from_dict(data)


@pytest.fixture(scope="session")
def cosmos_registries() -> None:
    """Our models, trainers and rollouts in cosmos-rl's registries (as the bridge does)."""
    from cosmos_sana.compat.cosmos_rl import register_all
    from cosmos_sana.plugin_manager import installed_plugins

    register_all(installed_plugins())


def build_trainer(config: Any) -> Any:
    """The registered trainer class for ``config``, constructed like cosmos-rl's workers do."""
    from cosmos_rl.policy.trainer.base import TrainerRegistry
    from cosmos_rl.utils.parallelism import ParallelDims

    from cosmos_sana_plugins.datasets.packer import SanaDataPacker

    packer = SanaDataPacker()
    packer.setup(config)
    key = config.train.train_policy.trainer_type
    if config.train.train_policy.type == "sft":
        key = "diffusers_" + key
    cls = TrainerRegistry.get_trainer_cls(key)
    return cls(config, ParallelDims.from_config(config.policy.parallelism), data_packer=packer, val_data_packer=packer)


def build_rollout(config: Any, model: Any) -> Any:
    from cosmos_rl.rollout.rollout_base import RolloutRegistry
    from cosmos_rl.utils.parallelism import ParallelDims

    rollout = RolloutRegistry.get_rollout_cls(config.rollout.backend)(
        config, ParallelDims.from_config(config.rollout.parallelism), torch.device("cpu")
    )
    rollout.init_engine(None, config.train.seed, "auto")
    rollout.set_underlying_model(model)
    return rollout


def payloads(prompts: list[str], first_index: int = 0) -> list[Any]:
    from cosmos_rl.dispatcher.data.schema import RLPayload

    return [RLPayload(prompt={"prompt": p, "metadata": {}}, prompt_idx=first_index + i) for i, p in enumerate(prompts)]


def scored_rollouts(rollout: Any, prompts: list[str], reward_fn: Any, first_index: int = 0) -> list[Any]:
    """Generate, score with ``reward_fn(media [n, ...]) -> list[float]`` and split into ``Rollout``s
    with cosmos-rl's own ``extract_rollouts`` (what the trainer receives)."""
    from cosmos_rl.utils.payload import extract_rollouts

    batch = payloads(prompts, first_index)
    results = rollout.rollout_generation(batch, None, None, None)
    out = []
    for payload, result in zip(batch, results):
        n = len(result.completions)
        rewards = [float(r) for r in reward_fn(result.completions)]
        payload.completions, payload.extra_info = result.completions, result.extra_info
        payload.rewards, payload.advantages, payload.filter_rewards = rewards, [0.0] * n, [0.0] * n
        payload.report_metrics = [{"score": r} for r in rewards]
        out += extract_rollouts([payload], False)[0]
    return out


def brightness(media: torch.Tensor) -> list[float]:
    """A cheap deterministic reward: mean pixel value per sample."""
    return media.flatten(1).mean(1).tolist()
