"""Sol-RL's best-of-n names in ``[custom.rollout.best_of_n]`` mean what they mean in Sol-RL's ``train_sana.py``;
the best-of-n recipe's tiny counterpart trains on CPU; NVFP4 drafts are refused off Blackwell."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest
import tomli_w
import torch
from fixtures_trainers import recipe
from pydantic import ValidationError

from cosmos_sana.config.best_of_n import BestOfNOptions

TOML = Path(__file__).resolve().parents[1] / "toml"
OURS = {"num_drafts": 96, "preview_steps": 6, "preview_model": "nvfp4", "fullrollout_model": "compile"}
SOL_RL = {"num_image_per_prompt": 96, "preview_step": 6, "preview_model": "compile_nvfp4", "fullrollout_model": "compile"}


def test_sol_rl_names_resolve_to_our_settings() -> None:
    assert BestOfNOptions(**SOL_RL) == BestOfNOptions(**OURS)
    assert BestOfNOptions(**SOL_RL, full_rollout_num=24).model_dump(exclude={"full_rollout_num"}) == \
        BestOfNOptions(**OURS).model_dump(exclude={"full_rollout_num"})
    # both names with the same value are fine
    assert BestOfNOptions(**SOL_RL, num_drafts=96, preview_steps=6) == BestOfNOptions(**OURS)


@pytest.mark.parametrize(
    ("extra", "names"),
    [({"num_drafts": 48}, ("num_image_per_prompt = 96", "num_drafts = 48")),
     ({"preview_steps": 4}, ("preview_step = 6", "preview_steps = 4"))],
)
def test_both_names_with_different_values_is_an_error(extra: dict, names: tuple[str, str]) -> None:
    with pytest.raises(ValidationError) as info:
        BestOfNOptions(**SOL_RL, **extra)
    for name in names:
        assert f"custom.rollout.best_of_n.{name}" in str(info.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [({"preview_step": 0}, "preview_step = 0 (Sol-RL: no preview, every image at full quality) is not supported"),
     ({"fullrollout_model": "compile_nvfp4"}, "fullrollout_model = 'compile_nvfp4' (Sol-RL's naive-quant baseline)")],
)
def test_sol_rl_settings_we_do_not_run_are_refused_by_name(override: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BestOfNOptions(**{**SOL_RL, **override})


def test_rollout_batch_follows_sol_rl_auto_rule() -> None:
    from cosmos_sana_plugins.rollout.best_of_n import BestOfNSampler

    # Sol-RL's _auto_rollout_bsz: largest divisor of num_image_per_prompt not above min(24, it)
    for drafts, expected in ((96, 24), (48, 24), (36, 18), (40, 20), (7, 7), (2, 2)):
        sampler = BestOfNSampler(BestOfNOptions(num_image_per_prompt=drafts), 2, score=lambda *a: [])
        assert sampler.chunk == expected, drafts


def _tiny_with(table: dict, tmp_path: Path, n_generation: int | None = None) -> Path:
    with open(TOML / "tiny" / "sana-image-nft-best-of-n.toml", "rb") as handle:
        data = tomllib.load(handle)
    data["custom"]["rollout"]["best_of_n"] = table
    if n_generation is not None:
        data["rollout"]["n_generation"] = n_generation
    path = tmp_path / "recipe.toml"
    path.write_bytes(tomli_w.dumps(data).encode())
    return path


def test_full_rollout_num_is_n_generation_checked_by_validate(tmp_path: Path, cosmos_registries) -> None:
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.config import SanaCustomConfig
    from cosmos_sana.validation import ConfigInvalid, validate_file

    registry = installed_plugins()
    sol = {"num_image_per_prompt": 8, "preview_step": 2, "full_rollout_num": 4}
    data = validate_file(_tiny_with(sol, tmp_path), registry=registry)  # the tiny recipe's n_generation is 4
    ours = validate_file(TOML / "tiny" / "sana-image-nft-best-of-n.toml", registry=registry)
    assert data["rollout"]["n_generation"] == ours["rollout"]["n_generation"] == 4
    resolved = SanaCustomConfig(**copy.deepcopy(data["custom"])).rollout.best_of_n
    assert resolved.model_dump(exclude={"full_rollout_num"}) == \
        SanaCustomConfig(**copy.deepcopy(ours["custom"])).rollout.best_of_n.model_dump(exclude={"full_rollout_num"})

    with pytest.raises(ConfigInvalid) as info:
        validate_file(_tiny_with({**sol, "full_rollout_num": 3}, tmp_path), registry=registry)
    assert "full_rollout_num = 3 (Sol-RL's name) and [rollout] n_generation = 4" in str(info.value)
    with pytest.raises(ConfigInvalid, match=r"n_generation = 12 .* must be in \[1, custom.rollout.best_of_n.num_drafts = 8\]"):
        validate_file(_tiny_with({"num_drafts": 8}, tmp_path, n_generation=12), registry=registry)


def test_nvfp4_drafts_are_refused_off_blackwell(monkeypatch) -> None:
    from cosmos_sana_plugins.rollout.best_of_n import check_preview_support

    kind = BestOfNOptions(num_drafts=4, preview_model="compile_nvfp4").preview_model
    assert kind == "nvfp4"
    with pytest.raises(ValueError, match="preview_model = 'nvfp4' needs a CUDA GPU \\(Blackwell\\); this run's device is cpu"):
        check_preview_support(kind, torch.device("cpu"))
    # an H200 (compute capability 9.0): only the capability query is stood in for
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    with pytest.raises(ValueError, match=r"needs a Blackwell GPU \(compute capability >= 10.0\); NVIDIA H200 has 9.0"):
        check_preview_support(kind, torch.device("cuda", 0))
    check_preview_support("fp8", torch.device("cuda", 0))  # FP8 drafts are allowed on Hopper (torchao present)


def test_tiny_best_of_n_recipe_trains_on_cpu(tiny_image_pipeline_dir, tmp_path, cosmos_registries) -> None:
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    config = recipe("sana-image-nft-best-of-n", tiny_image_pipeline_dir, tmp_path, {"train.ckpt.enable_checkpoint": False})
    trainer, rollout = build_components(config)
    reports = run_local(config, 2, (trainer, rollout))
    assert len(reports) == 2 and all(torch.isfinite(torch.tensor(r["reward/mean"])) for r in reports)
    sampler = rollout._best_of_n  # the rollouts went through best-of-n: 8 drafts, the 2 best and 2 worst kept
    assert sampler is not None and (sampler.options.num_drafts, sampler.keep, sampler.chunk) == (8, 4, 8)
