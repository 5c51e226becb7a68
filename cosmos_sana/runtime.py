"""Build the components cosmos-rl's worker entry takes, from ``[custom]`` and the plugins.

Each builder is a factory taking cosmos-rl's ``Config`` so that workers, which
receive the config from the controller, build the same components as the
controller does from the TOML.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cosmos_sana.plugin_manager import PluginRegistry
from cosmos_sana.settings import component_params, settings_of


def dataset_factory(registry: PluginRegistry, field: str) -> Callable[[Any], Any] | None:
    """A ``Config -> Dataset`` factory for ``[custom.<field>]`` (data / val_data).

    The validation dataset is not built at all when ``[validation] enable`` is false, so a
    missing validation folder cannot stop a run that never validates.
    """

    def build(cosmos_config: Any) -> Any:
        if field == "val_data" and not validation_enabled(cosmos_config):
            return None
        settings = settings_of(cosmos_config)
        ref = getattr(settings, field)
        if ref is None:
            return None
        params = component_params(registry, "dataset", ref, f"custom.{field}")
        spec = registry.get("dataset", ref.name)
        return spec.load()(params, cosmos_config=cosmos_config, on_bad_sample=ref.on_bad_sample)

    return build


def validation_enabled(cosmos_config: Any) -> bool:
    """``[validation] enable`` of a cosmos-rl ``Config`` or a raw TOML dict (cosmos-rl's default: off)."""
    if isinstance(cosmos_config, dict):
        return bool(cosmos_config.get("validation", {}).get("enable", False))
    return bool(cosmos_config.validation.enable)


def data_packer_factory(registry: PluginRegistry, name: str) -> Callable[[Any], Any]:
    def build(cosmos_config: Any) -> Any:
        return registry.get("data_packer", name).load()()

    return build


def reward_fns_factory(registry: PluginRegistry) -> Callable[..., Any]:
    """One cosmos-rl reward function scoring every ``[[custom.rewards]]`` term."""
    from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn

    return CosmosRewardFn(registry)
