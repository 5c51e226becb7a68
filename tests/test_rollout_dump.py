"""COSMOS_SANA_ROLLOUT_DUMP: the sana rollout saves its first training step's rollouts, and two
launches' dumps compare sample by sample (what scripts/device/speed_defaults.sh relies on)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from fixtures_trainers import build_rollout, build_trainer, payloads, recipe
from safetensors.torch import load_file

from cosmos_sana_plugins.rollout.rollout_dump import ROLLOUT_DUMP_ENV

pytestmark = pytest.mark.usefixtures("torch_single_thread")

PROMPTS = ["a red cube", "a blue sky"]
CPU_SPEED = {"linear_attention": "bf16", "cache_text_kv": True, "compile_blocks": True, "compile_backend": "eager"}


def _report_module():
    path = Path(__file__).resolve().parents[1] / "scripts" / "speed_defaults_report.py"
    spec = importlib.util.spec_from_file_location("speed_defaults_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(pipeline: Path, run: Path, monkeypatch, speed: dict | None = None):
    """A trainer and its rollout dumping to ``run/rollout-dump``."""
    overrides = {"rollout.n_generation": 2, "policy.diffusers.sample.num_steps": 3,
                 "custom.reward_runtime": {"mode": "sync"}}
    if speed:
        overrides["custom.rollout.speed"] = speed
    config = recipe("sana-image-nft", pipeline, run / "out", overrides)
    trainer = build_trainer(config)
    monkeypatch.setenv(ROLLOUT_DUMP_ENV, str(run / "rollout-dump"))
    return trainer, build_rollout(config, trainer.model)


def _generate(rollout, trainer, completed_steps: int, is_validation: bool = False):
    trainer.policies.completed_steps = completed_steps
    return rollout.rollout_generation(payloads(PROMPTS), None, None, None, is_validation=is_validation)


def test_first_step_is_dumped_and_compares_with_speed_features_on(tiny_image_pipeline_dir, tmp_path, monkeypatch,
                                                                  cosmos_registries):
    trainer, rollout = _launch(tiny_image_pipeline_dir, tmp_path / "off", monkeypatch)
    first = _generate(rollout, trainer, 0)
    second = _generate(rollout, trainer, 0)  # the first step sampled in two calls
    _generate(rollout, trainer, 0, is_validation=True)
    _generate(rollout, trainer, 1)
    dump = tmp_path / "off" / "rollout-dump"
    assert sorted(p.name for p in dump.iterdir()) == [
        "step000000-rank0-first000000.safetensors", "step000000-rank0-first000004.safetensors"]
    for name, results in (("first000000", first), ("first000004", second)):
        saved = load_file(str(dump / f"step000000-rank0-{name}.safetensors"))
        torch.testing.assert_close(saved["latents"], torch.cat([r.extra_info["x0"] for r in results]), rtol=0, atol=0)
        torch.testing.assert_close(saved["media"], torch.cat([r.completions for r in results]), rtol=0, atol=0)
        assert saved["seeds"].tolist() == torch.cat([r.extra_info["seeds"] for r in results]).tolist()

    fast_trainer, fast_rollout = _launch(tiny_image_pipeline_dir, tmp_path / "fast", monkeypatch, CPU_SPEED)
    _generate(fast_rollout, fast_trainer, 0)
    _generate(fast_rollout, fast_trainer, 0)
    report = _report_module().compare_dumps(tmp_path / "fast", tmp_path / "off")
    assert report["files_compared"] == 2 and report["files_missing"] == []
    assert report["within_tolerance"] is True
    assert 0 < report["latents"]["max_abs_diff"] < 1e-5  # bf16-style attention maths differ in rounding only
    assert report["latents"]["relative_error"] < 1e-5 and report["media"]["max_abs_diff"] < 1e-5


def test_without_the_variable_nothing_is_written(tiny_image_pipeline_dir, tmp_path, monkeypatch, cosmos_registries):
    trainer, _ = _launch(tiny_image_pipeline_dir, tmp_path, monkeypatch)
    monkeypatch.delenv(ROLLOUT_DUMP_ENV)
    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path / "out", {"rollout.n_generation": 2})
    _generate(build_rollout(config, trainer.model), trainer, 0)
    assert not list(tmp_path.rglob("*.safetensors"))
