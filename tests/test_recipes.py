"""Every shipped recipe validates strictly, and its trainer accepts it."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

TOML = Path(__file__).resolve().parents[1] / "toml"
RECIPES = sorted(TOML.glob("*.toml")) + sorted(TOML.glob("tiny/*.toml"))
NAMES = ["sana-image-sft", "sana-image-sft-lora", "sana-image-nft", "sana-image-nft-best-of-n", "sana-image-grpo",
         "sana-image-ddrl", "sana-video-sft-lora", "sana-video-nft"]


def load(path: Path) -> dict:
    with path.open("rb") as handle:
        return tomllib.load(handle)


def test_every_recipe_is_shipped_full_size_and_tiny():
    assert sorted(p.stem for p in TOML.glob("*.toml")) == sorted(NAMES)
    assert sorted(p.stem for p in TOML.glob("tiny/*.toml")) == sorted(NAMES)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(TOML)))
def test_recipe_validates_and_its_trainer_accepts_it(path, cosmos_registries):
    from cosmos_rl.policy.trainer.base import TrainerRegistry

    from cosmos_sana.compat.cosmos_rl import cosmos_config_class
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.validation import validate_file

    data = validate_file(path, registry=installed_plugins())
    config = cosmos_config_class().from_dict(copy.deepcopy(data))
    policy = config.train.train_policy
    key = ("diffusers_" if policy.type == "sft" else "") + policy.trainer_type
    TrainerRegistry.get_trainer_cls(key).check_config(config)
    if policy.type == "grpo":
        assert config.mode == "colocated" and policy.uncentralized_training
        assert config.rollout.backend == "sana" and config.policy.parallelism.tp_size == 1
    assert data["custom"]["package"] == "cosmos-sana"


def test_nft_recipe_follows_the_published_settings():
    data = load(TOML / "sana-image-nft.toml")
    policy, diffusers, train = data["policy"], data["policy"]["diffusers"], data["train"]
    assert (data["mode"], train["train_policy"]["type"], train["train_policy"]["trainer_type"]) == \
        ("colocated", "grpo", "sana_nft")
    lora = policy["lora"]
    assert (lora["r"], lora["lora_alpha"], lora["init_lora_weights"], lora["lora_names"]) == \
        (32, 64, "gaussian", ["default", "old"])
    assert "timestep_fraction" not in diffusers and diffusers["timesteps_fraction"] == 0.6
    assert (diffusers["sample"]["num_steps"], diffusers["sample"]["guidance_scale"]) == (10, 1.0)
    assert (train["optm_lr"], train["optm_weight_decay"], train["optm_grad_norm_clip"]) == (3e-4, 1e-4, 1.0)
    assert (train["train_policy"]["kl_beta"], diffusers["weight_copy_decay_type"], train["ema_decay"]) == (1e-4, 1, 0.9)
    assert policy["parallelism"]["tp_size"] == 1
    for path in (TOML / "tiny").glob("*.toml"):
        tiny = load(path)
        if tiny.get("mode") == "colocated":
            assert [r["name"] for r in tiny["custom"]["rewards"]] == ["jpeg_compressibility"], path.name


def test_misspelt_timestep_fraction_is_caught(tmp_path):
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.validation import ConfigInvalid, validate_file

    text = (TOML / "tiny" / "sana-image-nft.toml").read_text().replace("timesteps_fraction", "timestep_fraction")
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ConfigInvalid, match="timestep_fraction.*did you mean 'timesteps_fraction'"):
        validate_file(bad, registry=installed_plugins())


def test_speed_features_ship_on_only_where_a_launch_checked_them():
    """The NFT and Flow-GRPO recipes ship bf16 attention, the text K/V cache and compiled blocks (each
    checked inside an H200 launch against the same launch without them); CUDA graphs stay off; the other
    recipes, the tiny ones included, leave them off."""
    from cosmos_sana.config.rollout import SpeedOptions

    checked = {TOML / "sana-image-nft.toml", TOML / "sana-image-grpo.toml"}
    for path in checked:
        speed = SpeedOptions(**load(path)["custom"]["rollout"]["speed"])
        assert (speed.linear_attention, speed.cache_text_kv, speed.compile_blocks, speed.cuda_graph_max_batch) == \
            ("bf16", True, True, 0), path.name
    for path in set(RECIPES) - checked:
        assert "speed" not in load(path).get("custom", {}).get("rollout", {}), path.name
