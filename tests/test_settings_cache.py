"""``[custom]`` is validated once per config: the rollout, the trainer and every reward call share one parse."""

from __future__ import annotations

from typing import Any

import pytest
from fixtures_trainers import build_rollout, build_trainer, recipe

from cosmos_sana import settings
from cosmos_sana.rewards import ledger
from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn
from cosmos_sana.settings import SettingsError, settings_of


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The ``[custom]`` tables validated from now on (cache emptied first)."""
    seen: list[dict[str, Any]] = []
    real = settings.parse_custom

    def counting(custom: dict[str, Any], source: str = "<config>") -> Any:
        seen.append(custom)
        return real(custom, source)

    monkeypatch.setattr(settings, "parse_custom", counting)
    monkeypatch.setattr(settings, "_PARSED", settings._ParsedCustom())
    return seen


def test_one_parse_per_config_and_again_when_custom_changes(parses):
    config = {"custom": {"package": "cosmos-sana", "rollout": {"sampler": "sde"}}}
    first = settings_of(config)
    assert settings_of(config) is first and len(parses) == 1
    config["custom"]["rollout"]["sampler"] = "cps"  # changed in place: parsed again, never stale
    assert settings_of(config).rollout.sampler == "cps" and len(parses) == 2
    other = {"custom": {"package": "cosmos-sana", "rollout": {"sampler": "cps"}}}
    assert settings_of(other) is not first and len(parses) == 3
    config["custom"]["rollout"]["sampler"] = "euler"
    with pytest.raises(SettingsError, match=r"custom\.rollout\.sampler"):
        settings_of(config)
    with pytest.raises(SettingsError, match=r"custom\.rollout\.sampler"):  # a bad table is never cached
        settings_of(config)


def test_a_rollout_and_its_reward_calls_parse_custom_once(
    parses, tiny_image_pipeline_dir, tmp_path, cosmos_registries, recording_scorers, monkeypatch
):
    from cosmos_rl.dispatcher.data.schema import RLPayload

    monkeypatch.setattr(ledger, "_schedulers", {})
    _, registry = recording_scorers
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, {
        "custom.rewards": [{"name": "mean"}], "custom.reward_runtime": {"mode": "sync", "retries": 0},
    })
    rollout = build_rollout(config, build_trainer(config).model)
    rollout.registry = registry
    batch = [RLPayload(prompt={"prompt": p, "metadata": {}}, prompt_idx=i) for i, p in enumerate(["a", "b"])]
    results = rollout.rollout_generation(batch, None, None, None)
    reward_fn = CosmosRewardFn(registry)
    for payload, result in zip(batch, results, strict=True):
        for completion in result.completions:
            reward_fn(completion, None, config=config, prompt=payload.prompt)
    try:
        assert len(parses) == 1, f"[custom] validated {len(parses)} times"
    finally:
        for scheduler in ledger._schedulers.values():
            scheduler.close()


def test_a_table_equal_only_up_to_value_types_is_parsed_again(parses):
    """``1 == True`` in Python, but a component's ``args`` keep the value's type: a config object that
    reuses a freed one's id with such a table must not get the other's parse."""
    config = {"custom": {"package": "cosmos-sana", "rewards": [{"name": "mean", "args": {"x": 1}}]}}
    assert settings_of(config).rewards[0].args == {"x": 1}
    config["custom"]["rewards"][0]["args"]["x"] = True  # same id, == the cached table
    args = settings_of(config).rewards[0].args
    assert args["x"] is True and len(parses) == 2
