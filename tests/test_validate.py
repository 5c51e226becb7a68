"""``cosmos-sana validate``: strict checks of cosmos-rl's sections and of ``[custom]``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_sana.cli import main
from cosmos_sana.plugin_manager import load_plugins
from cosmos_sana.validation import ConfigInvalid, apply_overrides, validate_file

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "toml").rglob("*.toml"))

BASE = """
mode = "colocated"
[train]
output_dir = "{out}"
[train.train_policy]
type = "sft"
[policy]
model_name_or_path = "/models/sana"
[policy.parallelism]
tp_size = 1
[custom]
package = "cosmos-sana"
"""

PARAMS_REWARD = """
from pydantic import BaseModel, ConfigDict
from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import RewardSpec

class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: float = 0.5

def closeness(media, prompts, metadata, target=0.5):
    return [1.0 - abs(float(m.mean()) - target) for m in media]

@hookimpl
def cosmos_sana_rewards():
    return [RewardSpec(name="acme_closeness", target=closeness, params=Args)]
"""


def write(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(BASE.format(out=tmp_path / "out") + extra)
    return path


@pytest.mark.skipif(not RECIPES, reason="no recipes yet")
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_recipe_validates(recipe):
    validate_file(recipe, registry=load_plugins())


def test_misspelt_upstream_key_is_an_error_with_a_hint(tmp_path, capsys):
    path = write(tmp_path, "[policy.diffusers]\ntimestep_fraction = 0.6\n")
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: policy.diffusers.timestep_fraction: unknown key" in err
    assert "did you mean 'timesteps_fraction'?" in err


def test_unknown_custom_key_and_wrong_type_are_named(tmp_path):
    path = write(tmp_path, "typo_key = 1\n[custom.reward_runtime]\nworkers = 'many'\n")
    with pytest.raises(ConfigInvalid) as info:
        validate_file(path, registry=load_plugins())
    paths = {issue.path for issue in info.value.issues}
    assert paths == {"custom.typo_key", "custom.reward_runtime.workers"}


def test_documented_choices_are_enforced(tmp_path):
    path = write(tmp_path, "[policy.diffusers]\ndtype = 'float8'\n")
    with pytest.raises(ConfigInvalid, match=r"policy.diffusers.dtype: 'float8' is not one of"):
        validate_file(path, registry=load_plugins())


def test_upstream_type_errors_carry_their_key_path(tmp_path):
    path = write(tmp_path, "[train.ckpt]\nsave_freq = 'often'\n")
    with pytest.raises(ConfigInvalid) as info:
        validate_file(path, registry=load_plugins())
    assert [i.path for i in info.value.issues] == ["train.ckpt.save_freq"]


def test_third_party_reward_usable_from_a_recipe(tmp_path, make_distribution):
    make_distribution("acme-rewards", "acme_rewards", PARAMS_REWARD)
    registry = load_plugins()
    good = write(tmp_path, "[[custom.rewards]]\nname = 'acme_closeness'\nweight = 2.0\nargs = {target = 0.25}\n")
    validate_file(good, registry=registry)

    bad = write(tmp_path, "[[custom.rewards]]\nname = 'acme_closenes'\n")
    with pytest.raises(ConfigInvalid, match="did you mean 'acme_closeness'"):
        validate_file(bad, registry=registry)

    bad_args = write(tmp_path, "[[custom.rewards]]\nname = 'acme_closeness'\nargs = {targt = 0.25}\n")
    with pytest.raises(ConfigInvalid, match=r"custom.rewards\[0\].args.targt"):
        validate_file(bad_args, registry=registry)


def test_required_plugin_distribution_must_be_installed(tmp_path):
    path = write(tmp_path, "plugins = ['acme-missing']\n")
    with pytest.raises(ConfigInvalid, match="distribution 'acme-missing' provides no installed cosmos-sana plugin"):
        validate_file(path, registry=load_plugins())


def test_overrides_apply_before_validation(tmp_path):
    data = apply_overrides({"train": {"epoch": 1}}, ["train.epoch=3", "policy.model_name_or_path=/x/y", "a.b=[1, 2]"])
    assert data == {"train": {"epoch": 3}, "policy": {"model_name_or_path": "/x/y"}, "a": {"b": [1, 2]}}


def test_cli_exit_code_for_a_bad_file(tmp_path):
    path = write(tmp_path, "[policy.diffusers]\ntimestep_fraction = 0.6\n")
    out = subprocess.run([sys.executable, "-m", "cosmos_sana.cli", "validate", str(path)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "timestep_fraction" in out.stderr and out.stdout == ""


def test_the_trainers_own_refusals_surface_at_validate_time(tmp_path):
    recipe = ROOT / "toml" / "tiny" / "sana-image-nft.toml"
    with pytest.raises(ConfigInvalid, match=r"trainer 'sana_nft': policy.diffusers.sample.guidance_scale = 4.5"):
        validate_file(recipe, ["policy.diffusers.sample.guidance_scale=4.5"], registry=load_plugins())
    ddrl = ROOT / "toml" / "tiny" / "sana-image-ddrl.toml"
    with pytest.raises(ConfigInvalid, match="train.train_policy.kl_beta = 0.04: DDRL replaces the KL penalty"):
        validate_file(ddrl, ["train.train_policy.kl_beta=0.04"], registry=load_plugins())


def test_cosmos_rls_own_worker_check_runs_at_validate_time():
    """A batch the policy worker would refuse at start-up (after minutes of model loading) is
    refused by ``validate`` with upstream's reason."""
    recipe = ROOT / "toml" / "sana-image-nft.toml"
    with pytest.raises(ConfigInvalid, match=r"policy worker would refuse.*divisible by data-parallel size\(8\) \* mini_batch\(7\)"):
        validate_file(recipe, ["train.train_policy.mini_batch=7"], registry=load_plugins())


@pytest.mark.parametrize("recipe", [p for p in RECIPES if "sft" in p.name], ids=lambda p: p.name)
def test_sft_recipes_pass_the_workers_trainer_lookup(recipe):
    """The policy worker looks up the bare ``sana_sft`` before the SFT worker prefixes it:
    without the alias this is ``Trainer sana_sft is not supported`` and the launch hangs."""
    import tomllib

    from cosmos_rl.policy.trainer.base import TrainerRegistry

    from cosmos_sana.compat.cosmos_rl import check_policy_worker_config, cosmos_config_class, register_all

    register_all(load_plugins())
    data = tomllib.loads(recipe.read_text())
    key = data["train"]["train_policy"]["trainer_type"]
    assert TrainerRegistry.get_trainer_cls(key) is TrainerRegistry.get_trainer_cls(f"diffusers_{key}")
    check_policy_worker_config(cosmos_config_class().model_validate(data))
