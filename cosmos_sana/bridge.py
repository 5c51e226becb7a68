"""cosmos-rl's script argument: ``cosmos-rl --config X.toml cosmos_sana.bridge``.

Also what the autoload runs in place of cosmos-rl's stock entry modules for the
bare ``cosmos-rl --config X.toml`` form. In every role (controller, policy,
rollout, reference) it loads the plugins, registers them with cosmos-rl, and
calls cosmos-rl's worker entry with factories that build datasets, packers and
reward functions from ``[custom]`` once the role has its config. The Controller
role calls cosmos-rl's controller main directly instead, adding the prompt sampler
and resume adapter of :mod:`cosmos_sana.checkpoint.controller_resume` (the worker
entry does not forward ``resume_adapter``); unless ``COSMOS_SANA_FAST_STARTUP=0`` it first
runs the policy-worker start-up check the launcher's validation then leaves out.
"""

from __future__ import annotations

import os
import time
from typing import Any

from cosmos_sana.checkpoint.controller_resume import controller_resume_kwargs
from cosmos_sana.compat import cosmos_rl as upstream
from cosmos_sana.compat.autoload import INTERPRETER_STARTED
from cosmos_sana.log import get_logger
from cosmos_sana.plugin_manager import PluginRegistry, installed_plugins
from cosmos_sana.runtime import data_packer_factory, dataset_factory, reward_fns_factory

logger = get_logger(__name__)

DEFAULT_DATA_PACKER = "sana"


def worker_entry_kwargs(registry: PluginRegistry) -> dict[str, Any]:
    """The keyword arguments for cosmos-rl's ``worker_entry.main``."""
    from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn

    packer = data_packer_factory(registry, DEFAULT_DATA_PACKER) if "sana" in registry.names("data_packer") else None
    kwargs: dict[str, Any] = {
        "dataset": dataset_factory(registry, "data"),
        "val_dataset": dataset_factory(registry, "val_data"),
        "reward_fns": [reward_fns_factory(registry)],
        "val_reward_fns": [CosmosRewardFn(registry, validation=True)],  # [custom.guards] holdout_rewards
    }
    if packer is not None:
        kwargs["data_packer"] = packer
        kwargs["val_data_packer"] = packer
    return kwargs


def controller_kwargs(registry: PluginRegistry, config: Any) -> dict[str, Any]:
    """The keyword arguments for cosmos-rl's controller main: the worker-entry ones plus, for RL,
    the resumable prompt sampler and the adapter that continues it from our checkpoints."""
    return {**worker_entry_kwargs(registry), **controller_resume_kwargs(config)}


def check_at_controller_start(path: str, registry: PluginRegistry) -> None:
    """Unless ``COSMOS_SANA_FAST_STARTUP=0``, the launcher's ``cosmos-sana validate`` leaves out the
    policy-worker start-up check (``--no-startup-check``), whose imports this process has already
    paid; it runs here before the controller serves anything. A refused config raises
    :class:`~cosmos_sana.validation.StartupCheckError`: the controller exits and cosmos-rl's launcher
    stops the replicas it started beside it."""
    from cosmos_sana.validation import check_at_startup

    started = time.monotonic()
    check_at_startup(path, registry)
    logger.info("start-up check of %s passed in %.3f s", path, time.monotonic() - started)


def main() -> Any:
    registry = installed_plugins()
    upstream.register_all(registry)
    role = os.environ.get("COSMOS_ROLE", "<none>")
    logger.info(
        "cosmos-sana bridge active in role %s (%.1f s after interpreter start); registered with cosmos-rl: %s",
        role,
        time.monotonic() - INTERPRETER_STARTED,
        "; ".join(f"{kind}s={registry.names(kind)}" for kind in ("model", "trainer", "rollout")),
    )
    if role == "Controller":
        args, config = upstream.controller_config()
        if upstream.startup_patches_enabled():
            check_at_controller_start(args.config, registry)
        return upstream.run_controller(args=args, **controller_kwargs(registry, config))
    return upstream.run_worker_entry(**worker_entry_kwargs(registry))


if __name__ == "__main__":
    main()
