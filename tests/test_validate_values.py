"""``validate`` checks values and local paths, not only keys: each bad setting is named by its key,
every problem is reported in one pass, and each missing path comes with the step that fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_sana.cli import main
from cosmos_sana.plugin_manager import installed_plugins
from cosmos_sana.validation import ConfigInvalid, validate_file

ROOT = Path(__file__).resolve().parents[1]
NFT = ROOT / "toml" / "tiny" / "sana-image-nft.toml"
SFT = ROOT / "toml" / "tiny" / "sana-image-sft.toml"
VIDEO_NFT = ROOT / "toml" / "tiny" / "sana-video-nft.toml"
BEST_OF_N = ROOT / "toml" / "tiny" / "sana-image-nft-best-of-n.toml"


@pytest.fixture(scope="module")
def registry():
    return installed_plugins()


@pytest.fixture
def nft_sets(tiny_image_pipeline_dir: Path, tmp_path: Path) -> list[str]:
    """The tiny NFT recipe made whole on this machine: a real local model, outputs in tmp."""
    return [f'policy.model_name_or_path="{tiny_image_pipeline_dir}"', f'train.output_dir="{tmp_path / "out"}"']


def issues_of(recipe: Path, sets: list[str], registry) -> ConfigInvalid:
    with pytest.raises(ConfigInvalid) as info:
        validate_file(recipe, sets, registry, paths=True)
    return info.value


def test_the_base_recipe_is_valid_with_paths(nft_sets, registry):
    validate_file(NFT, nft_sets, registry, paths=True)


# (override, key path the report must name); the tiny recipe: n_generation 4, train_batch_per_replica 8,
# a tiny model whose VAE downsamples 2× with patch 1 (a 2-pixel grid)
BAD_VALUES = [
    ("train.train_batch_per_replica=0", "train.train_batch_per_replica"),
    ("train.train_batch_per_replica=-8", "train.train_batch_per_replica"),
    ("validation.batch_size=0", "validation.batch_size"),
    ("train.train_policy.mini_batch=0", "train.train_policy.mini_batch"),  # was a raw ZeroDivisionError
    ("train.optm_lr=nan", "train.optm_lr"),
    ("train.optm_lr=inf", "train.optm_lr"),
    ("train.optm_lr=-1e-4", "train.optm_lr"),
    ("train.epoch=0", "train.epoch"),
    ("train.ckpt.max_keep=0", "train.ckpt.max_keep"),
    ("policy.diffusers.inference_size=[0, 32]", "policy.diffusers.inference_size"),
    ("policy.diffusers.inference_size=[33, 32]", "policy.diffusers.inference_size"),
    ("policy.lora.r=0", "policy.lora.r"),
    ("policy.lora.lora_names=[]", "policy.lora.lora_names"),
    ('policy.lora.lora_names=["default"]', "policy.lora.lora_names"),  # NFT without its `old` adapter
    ("rollout.n_generation=0", "rollout.n_generation"),
    ("rollout.n_generation=3", "train.train_batch_per_replica"),  # 8 samples do not split into groups of 3
    ("rollout.n_generation_mini_batch=0", "rollout.n_generation_mini_batch"),
    ("policy.diffusers.timesteps_fraction=0.0", "policy.diffusers.timesteps_fraction"),
    ("policy.diffusers.timesteps_fraction=1.5", "policy.diffusers.timesteps_fraction"),
    ("policy.diffusers.sample.num_steps=0", "policy.diffusers.sample.num_steps"),
    ("policy.diffusers.sample.eval_num_steps=0", "policy.diffusers.sample.eval_num_steps"),
    ("train.train_policy.kl_beta=-0.1", "train.train_policy.kl_beta"),
    ("rollout.batch_size=0", "rollout.batch_size"),
    ('custom.checkpoint.chunk_size="0GB"', "custom.checkpoint.chunk_size"),
    ("custom.rewards=[]", "custom.rewards"),  # RL with nothing to score
    ('redis="not-a-port"', "redis"),
    ('redis="70000"', "redis"),
    ('custom.rewards=[{name = "jpeg_compressibility", weight = nan}]', "custom.rewards.0.weight"),
    ("policy.diffusers.nft_beta=nan", "policy.diffusers.nft_beta"),
    ("train.optm_grad_norm_clip=inf", "train.optm_grad_norm_clip"),
    ("custom.rollout.flow_shift=inf", "custom.rollout.flow_shift"),
    ('custom.data.args.path="builtin:nope"', "custom.data.args"),
    ('custom.package="cosmos_sana"', "custom.package"),  # a typo used to skip every [custom] check
]


@pytest.mark.parametrize(("override", "key"), BAD_VALUES, ids=[o for o, _ in BAD_VALUES])
def test_each_bad_value_is_refused_naming_its_key(override, key, nft_sets, registry):
    error = issues_of(NFT, [*nft_sets, override], registry)
    assert any(issue.path.startswith(key) or key in issue.message for issue in error.issues), str(error)
    assert f"{NFT}: " in str(error)


# values cosmos-rl's types let through that would fail late or silently mean something else:
# (override, the exact key path reported, a word of the fix the message must give)
SILENT_VALUES = [
    ("train.ckpt.save_freq=-5", "train.ckpt.save_freq", "greater than 0"),  # cosmos-rl's check named only [train.ckpt]
    ("train.optm_betas=[0.9, 1.5]", "train.optm_betas", "[0, 1)"),  # torch refused it once the model had loaded
    ("train.optm_betas=[-0.1, 0.999]", "train.optm_betas", "[0, 1)"),
    ("train.optm_betas=[0.9]", "train.optm_betas", "[0, 1)"),
    ("train.optm_weight_decay=-0.01", "train.optm_weight_decay", ">= 0"),
    ("train.epsilon=-1e-8", "train.epsilon", ">= 0"),
    ('train.epoch="ten"', "train.epoch", "integer"),
    ('train.optm_lr="fast"', "train.optm_lr", "'fast': must be a finite learning rate"),  # one issue, not one per type
    ("redis=12800", "redis", 'as a string, e.g. "12800"'),  # was pydantic's bare "Input should be a valid string"
    ("policy.diffusers.inference_size=[32]", "policy.diffusers.inference_size", "[height, width]"),
    ("policy.lora.lora_alpha=0", "policy.lora.lora_alpha", "> 0"),
    ("policy.diffusers.sample.num_steps=100000", "policy.diffusers.sample.num_steps", "[1, 1000]"),
    ("policy.diffusers.sample.guidance_scale=nan", "policy.diffusers.sample.guidance_scale", "finite"),
    ("policy.diffusers.sample.guidance_scale=-3.0", "policy.diffusers.sample.guidance_scale", ">= 0"),
    ("policy.diffusers.sample.noise_level=-1.0", "policy.diffusers.sample.noise_level", ">= 0"),
    ("policy.diffusers.timesteps_fraction=1e-9", "policy.diffusers.timesteps_fraction", "1/4 = 0.25 (one step)"),
    ('train.output_dir=""', "train.output_dir", "must name a folder"),
    ('policy.model_name_or_path=""', "policy.model_name_or_path", "model_name_or_path is required"),
    ("train.train_policy.mini_batch=64", "train.train_policy.mini_batch", "does not divide"),
    ("train.train_policy.mini_batch=3", "train.train_policy.mini_batch", "does not divide"),
    ("rollout.n_generation=16", "train.train_batch_per_replica", "multiple of rollout.n_generation"),
    ('custom.rewards=[{name = "jpeg_compresibility"}]', "custom.rewards[0].name",
     "did you mean 'jpeg_compressibility'?"),
    ("custom.guards.max_saturation=-0.5", "custom.guards.max_saturation", "greater than or equal to 0"),
    ("custom.guards.patience=0", "custom.guards.patience", "greater than or equal to 1"),
]


@pytest.mark.parametrize(("override", "key", "fix"), SILENT_VALUES, ids=[o for o, _, _ in SILENT_VALUES])
def test_a_value_that_would_fail_late_is_refused_at_its_key(override, key, fix, nft_sets, registry):
    error = issues_of(NFT, [*nft_sets, override], registry)
    (issue,) = [i for i in error.issues if i.path == key] or [None]
    assert issue is not None and fix in issue.message, str(error)


@pytest.mark.parametrize("override", ["train.train_policy=3", "rollout=1", "policy.diffusers.sample=1", "logging=false"])
def test_a_value_where_a_table_belongs_is_one_issue_not_a_traceback(override, nft_sets, registry):
    """cosmos-rl's own validators indexed ``train_policy = 3`` as a table (a TypeError); the defaults of
    the keys below such a value do not feed the rules between keys either."""
    key = override.partition("=")[0]
    error = issues_of(NFT, [*nft_sets, override], registry)
    assert [(i.path, i.message) for i in error.issues] == [
        (key, f"{override.partition('=')[2].replace('false', 'False')} must be a table ([{key}] with its keys)")]


def test_a_fraction_worth_most_of_the_only_step_trains_it(nft_sets, registry):
    """K = max(1, int(1 * 0.99)) = 1 is what 0.99 of one step asks for: not refused."""
    validate_file(NFT, [*nft_sets, "policy.diffusers.sample.num_steps=1", "policy.diffusers.timesteps_fraction=0.99"],
                  registry, paths=True)


def test_best_of_n_with_fewer_drafts_than_kept_samples(nft_sets, registry):
    error = issues_of(BEST_OF_N, [*nft_sets, "custom.rollout.best_of_n.num_drafts=2"], registry)
    assert any(i.path == "rollout.n_generation" and "num_drafts (2)" in i.message for i in error.issues), str(error)


def test_late_failing_values_are_reported_together(nft_sets, registry):
    sets = ["train.ckpt.save_freq=-5", "train.optm_betas=[0.9, 1.5]", "policy.lora.lora_alpha=0",
            "policy.diffusers.sample.guidance_scale=nan", "train.train_policy.mini_batch=3",
            'custom.rewards=[{name = "jpeg_compresibility"}]', "custom.guards.max_saturation=-0.5"]
    error = issues_of(NFT, [*nft_sets, *sets], registry)
    assert {i.path for i in error.issues} >= {
        "train.ckpt.save_freq", "train.optm_betas", "policy.lora.lora_alpha", "policy.diffusers.sample.guidance_scale",
        "train.train_policy.mini_batch", "custom.rewards[0].name", "custom.guards.max_saturation"}, str(error)


def test_every_problem_is_reported_in_one_pass(nft_sets, registry):
    sets = ["train.epoch=0", "train.optm_lr=nan", "rollout.batch_size=0", 'redis="x"',
            'custom.checkpoint.chunk_size="0GB"', "policy.lora.r=0"]
    error = issues_of(NFT, [*nft_sets, *sets], registry)
    assert {i.path for i in error.issues} >= {"train.epoch", "train.optm_lr", "rollout.batch_size", "redis",
                                              "custom.checkpoint.chunk_size", "policy.lora.r"}


def test_keep_all_checkpoints_and_unset_optionals_stay_valid(nft_sets, registry):
    validate_file(NFT, [*nft_sets, "train.ckpt.max_keep=-1", 'redis=""', "policy.diffusers.inference_size=[34, 30]"],
                  registry, paths=True)


def test_missing_model_folder_names_the_fix(tmp_path, registry):
    error = issues_of(NFT, [f'policy.model_name_or_path="{tmp_path / "no-model"}"'], registry)
    (issue,) = [i for i in error.issues if i.path == "policy.model_name_or_path"]
    assert "no such folder" in issue.message and f"cosmos-sana make-tiny --out {tmp_path / 'no-model'}" in issue.message


def test_a_hub_id_is_not_a_local_path(nft_sets, registry):
    validate_file(NFT, [*nft_sets, 'policy.model_name_or_path="Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers"'],
                  registry, paths=True)


def test_missing_data_init_from_and_native_checkpoint_are_named_with_their_fix(nft_sets, tmp_path, registry):
    sets = [*nft_sets, f'custom.data.args.path="{tmp_path / "prompts.txt"}"',
            f'custom.checkpoint.init_from="{tmp_path / "dcp"}"',
            f'custom.model.native_checkpoint="{tmp_path / "model.pth"}"']
    error = issues_of(NFT, sets, registry)
    by_key = {i.path: i.message for i in error.issues}
    assert f"cosmos-sana data check {tmp_path / 'prompts.txt'}" in by_key["custom.data.args.path"]
    assert "cosmos-sana convert-to-dcp" in by_key["custom.checkpoint.init_from"]
    assert "no such file" in by_key["custom.model.native_checkpoint"]


def test_a_video_recipe_on_a_pipeline_without_the_wan_vae(tiny_image_pipeline_dir, tmp_path, registry):
    error = issues_of(VIDEO_NFT, [f'policy.model_name_or_path="{tiny_image_pipeline_dir}"',
                                  f'train.output_dir="{tmp_path}"'], registry)
    assert any(i.path == "policy.model_name_or_path" and "Wan2.1 VAE" in i.message for i in error.issues)


def test_validation_data_is_checked_only_when_validation_is_on(tiny_image_pipeline_dir, image_folder, tmp_path, registry):
    sets = [f'policy.model_name_or_path="{tiny_image_pipeline_dir}"', f'train.output_dir="{tmp_path}"',
            f'custom.data.args.path="{image_folder}"', f'custom.val_data.args.path="{tmp_path / "val"}"']
    error = issues_of(SFT, sets, registry)
    assert [i.path for i in error.issues] == ["custom.val_data.args.path"]
    validate_file(SFT, [*sets, "validation.enable=false"], registry, paths=True)


def test_one_missing_folder_for_training_and_validation_data_is_one_issue(tiny_image_pipeline_dir, tmp_path, registry):
    missing = tmp_path / "images"
    sets = [f'policy.model_name_or_path="{tiny_image_pipeline_dir}"', f'train.output_dir="{tmp_path}"',
            f'custom.data.args.path="{missing}"', f'custom.val_data.args.path="{missing}"']
    error = issues_of(SFT, sets, registry)
    assert [(i.path, i.message) for i in error.issues] == [(
        "custom.data.args.path", f"{str(missing)!r} does not exist (also the path of custom.val_data.args.path): "
        f"point it at your data (layouts: README 'Data') and check it with `cosmos-sana data check {missing}`")]


def test_validation_dataset_is_not_built_when_validation_is_off(tmp_path, image_folder, registry):
    """With ``[validation] enable = false`` the factory builds nothing: a missing validation folder
    cannot stop the run (it used to, after the model had loaded)."""
    from cosmos_sana.compat.cosmos_rl import cosmos_config_class
    from cosmos_sana.runtime import dataset_factory
    from cosmos_sana.validation import load_toml

    data = load_toml(SFT, [f'train.output_dir="{tmp_path}"', f'custom.data.args.path="{image_folder}"',
                           f'custom.val_data.args.path="{tmp_path / "missing"}"', "validation.enable=false"])
    config = cosmos_config_class().model_validate(data)
    assert dataset_factory(registry, "val_data")(config) is None
    assert len(dataset_factory(registry, "data")(config)) > 0
    config.validation.enable = True
    with pytest.raises(Exception, match="missing"):
        dataset_factory(registry, "val_data")(config)


def test_cli_lists_every_issue_and_can_skip_path_checks(tmp_path, capsys):
    sets = ["--set", f'policy.model_name_or_path="{tmp_path / "none"}"', "--set", "train.epoch=0"]
    assert main(["validate", str(NFT), *sets]) == 1
    err = capsys.readouterr().err
    assert "policy.model_name_or_path" in err and "train.epoch" in err and "INVALID (2 issues)" in err
    assert main(["validate", str(NFT), *sets, "--no-path-check"]) == 1
    err = capsys.readouterr().err
    assert "policy.model_name_or_path" not in err and "INVALID (1 issue)" in err


def test_component_args_are_checked_beside_other_custom_errors(nft_sets, registry):
    sets = [*nft_sets, 'custom.checkpoint.chunk_size="0GB"', 'custom.data.args={path = "builtin:demo", bogus = 1}']
    paths = {i.path for i in issues_of(NFT, sets, registry).issues}
    assert paths >= {"custom.checkpoint.chunk_size", "custom.data"}


def test_inference_size_grid_of_a_hub_model_from_the_local_cache(tiny_image_pipeline_dir, tmp_path, monkeypatch, registry):
    """A Hub id whose configs are in the Hugging Face cache is checked like a folder (no network)."""
    import shutil

    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--acme--tiny-sana" / "snapshots" / "abc123"
    for name in ("model_index.json", "transformer/config.json", "vae/config.json"):
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_image_pipeline_dir / name, snapshot / name)
    (tmp_path / "hub" / "models--acme--tiny-sana" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-sana" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    sets = ['policy.model_name_or_path="acme/tiny-sana"', f'train.output_dir="{tmp_path}"']
    validate_file(NFT, [*sets, "policy.diffusers.inference_size=[34, 30]"], registry, paths=True)
    error = issues_of(NFT, [*sets, "policy.diffusers.inference_size=[33, 30]"], registry)
    assert [i.path for i in error.issues] == ["policy.diffusers.inference_size"] and "multiples of 2" in str(error)
