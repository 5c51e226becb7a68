"""Plugin discovery through the ``cosmos_sana.plugins`` entry-point group."""

from __future__ import annotations

import pytest

from cosmos_sana.plugin_manager import (
    DuplicateComponentError,
    PluginError,
    UnknownComponentError,
    load_plugins,
)

REWARD_PLUGIN = """
from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import RewardSpec

def brightness(media, prompts, metadata, **args):
    return [float(m.mean()) for m in media]

@hookimpl
def cosmos_sana_rewards():
    return [RewardSpec(name="{name}", target=brightness, description="mean pixel value")]
"""


def test_builtins_are_discovered_through_entry_points():
    registry = load_plugins()
    origins = {e.plugin for kind in registry.kinds() for e in registry.entries(kind)}
    assert origins == {"sana", "datasets", "rewards", "trainers", "rollout"}
    (rollout,) = [e for e in registry.entries("rollout") if e.spec.name == "sana"]
    assert rollout.plugin == "rollout" and rollout.spec.target == "cosmos_sana_plugins.rollout.rollout:SanaRollout"
    for kind in registry.kinds():
        for entry in registry.entries(kind):
            assert entry.distribution.startswith("cosmos-sana ")


def test_third_party_distribution_adds_a_reward(make_distribution):
    make_distribution("acme-rewards", "acme_rewards", REWARD_PLUGIN.format(name="acme_brightness"))
    registry = load_plugins()
    (entry,) = [e for e in registry.entries("reward") if e.spec.name == "acme_brightness"]
    assert entry.distribution == "acme-rewards 1.0"
    assert entry.plugin == "acme_rewards"
    import torch

    assert entry.spec.load()(torch.full((2, 3, 4, 4), 0.25), ["a", "b"], [{}, {}]) == [0.25, 0.25]


def test_same_name_from_two_distributions_names_both(make_distribution):
    make_distribution("acme-one", "acme_one", REWARD_PLUGIN.format(name="shared_name"))
    make_distribution("acme-two", "acme_two", REWARD_PLUGIN.format(name="shared_name"))
    with pytest.raises(DuplicateComponentError) as info:
        load_plugins()
    message = str(info.value)
    assert "'shared_name'" in message
    assert "acme-one 1.0" in message and "acme-two 1.0" in message


def test_unknown_name_suggests_the_closest(make_distribution):
    make_distribution("acme-rewards", "acme_rewards", REWARD_PLUGIN.format(name="acme_brightness"))
    registry = load_plugins()
    with pytest.raises(UnknownComponentError, match="did you mean 'acme_brightness'"):
        registry.get("reward", "acme_brightnes")


def test_a_broken_plugin_module_is_reported(make_distribution):
    make_distribution("acme-broken", "acme_broken", "raise ImportError('missing dependency xyz')\n")
    with pytest.raises(PluginError, match="missing dependency xyz"):
        load_plugins()


def test_hook_returning_the_wrong_kind_is_rejected(make_distribution):
    source = """
from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import DatasetSpec

@hookimpl
def cosmos_sana_rewards():
    return [DatasetSpec(name="oops", target="x:y")]
"""
    make_distribution("acme-wrong", "acme_wrong", source)
    with pytest.raises(PluginError, match="returned a dataset spec 'oops' from hook cosmos_sana_rewards"):
        load_plugins()
