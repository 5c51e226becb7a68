"""A third-party reward: one entry point + one function, found through installed metadata."""

from __future__ import annotations

import pytest
import torch

from cosmos_sana.plugin_manager import load_plugins
from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.settings import parse_custom

PLUGIN = '''
from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import RewardSpec

def brightness(media, prompts, metadata):
    return media.mean(dim=(1, 2, 3)).tolist()

@hookimpl
def cosmos_sana_rewards():
    return [RewardSpec(name="brightness", target=brightness, modality="image")]
'''


def test_entry_point_reward_is_scored_from_a_custom_config(make_distribution):
    make_distribution("acme-rewards", "acme_rewards_plugin", PLUGIN)
    registry = load_plugins()
    assert "brightness" in registry.names("reward")
    assert registry.entries("reward")[registry.names("reward").index("brightness")].distribution == "acme-rewards 1.0"
    custom = {"package": "cosmos-sana", "rewards": [
        {"name": "brightness", "weight": 2.0, "clip_max": 0.5},
        {"name": "jpeg_compressibility", "weight": 1.0},
    ]}
    media = torch.stack([torch.full((3, 16, 16), 0.25), torch.full((3, 16, 16), 0.75)])
    scores = ScorerSet.from_settings(parse_custom(custom), registry).score(media, ["a", "b"])
    assert scores.components["brightness"] == pytest.approx([0.25, 0.75])
    jpeg = scores.components["jpeg_compressibility"]
    assert scores.total == pytest.approx([2 * 0.25 + jpeg[0], 2 * 0.5 + jpeg[1]])

    total, parts = CosmosRewardFn(registry)(media[0], None, config={"custom": custom}, prompt="a")
    assert total == pytest.approx(scores.total[0]) and parts["brightness"] == pytest.approx(0.25)
