"""scripts/speed_defaults_report.py on hand-made launches: timings, rewards, rollout differences and
side-by-side overlap against hand-derived numbers; bad input named. Plus the device script's dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "scripts" / "speed_defaults_report.py"
DEVICE_SCRIPT = ROOT / "scripts" / "device" / "speed_defaults.sh"
DUMP = "step000000-rank0-first000000.safetensors"


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *args], capture_output=True, text=True, timeout=60)


def launch(folder: Path, start: float, steps: list[tuple[float, float, float, float]], *, latents: torch.Tensor,
           seeds: list[int], exit_status: int = 0, log: str = "") -> Path:
    """A run folder: per step (step_s, rollout_s, train_s, reward), steps back to back from ``start``;
    the first step's dump; exit status and wall time as the device script writes them."""
    logs = folder / "sana-image-nft" / "logs"
    logs.mkdir(parents=True)
    rows, now = [], start
    for step, (step_s, rollout_s, train_s, reward) in enumerate(steps, start=1):
        now += step_s
        rows.append({"step": step, "wall_time": now, "time/step_s": step_s, "time/rollout_s": rollout_s,
                     "time/train_s": train_s, "reward/mean": reward, "memory/peak_gib": 3.0 + step})
    (logs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (logs / "policy_0.log").write_text(log)
    (folder / "rollout-dump").mkdir()
    media = latents.repeat(1, 3, 1, 1) / 4  # an "image" that follows the latents (exactly, in binary)
    save_file({"latents": latents, "media": media, "seeds": torch.tensor(seeds)}, str(folder / "rollout-dump" / DUMP))
    (folder / "exit_status").write_text(f"{exit_status}\n")
    (folder / "wall_s").write_text("200\n")
    return folder


@pytest.fixture
def runs(tmp_path):
    base = torch.ones(2, 1, 2, 2)  # ‖base‖ = √8
    nudged = base.clone()
    nudged[0, 0, 0, 0] += 2**-8  # relative error 2⁻⁸ / √8 ≈ 1.38e-3: inside 5e-3
    far = base.clone()
    far[1, 0, 1, 1] -= 2**-6  # 2⁻⁶ / √8 ≈ 5.52e-3: outside
    off = launch(tmp_path / "off", 1000.0, [(20.0, 2.0, 17.0, -0.10), (6.0, 1.0, 4.5, -0.09), (8.0, 1.2, 6.0, -0.08)],
                 latents=base, seeds=[11, 12])
    bf16 = launch(tmp_path / "bf16", 1000.0, [(22.0, 2.0, 19.0, -0.11), (4.0, 0.5, 3.0, -0.095),
                                               (5.0, 0.6, 4.0, -0.07), (6.0, 0.8, 4.5, -0.06)],
                  latents=nudged, seeds=[11, 12])
    # starts later: beside the others' last steps only
    compile_ = launch(tmp_path / "compile", 1030.0, [(90.0, 30.0, 55.0, -0.10), (3.0, 0.4, 2.2, -0.09)],
                      latents=far, seeds=[11, 12], exit_status=124,
                      log="W torch._dynamo hit config.recompile_limit (64)\ncaptured a CUDA graph for latents (4,)\n"
                          "captured a CUDA graph for latents (4,)\nTraceback (most recent call last):\n")
    return off, bf16, compile_


def test_timings_rewards_and_rollout_differences(runs, tmp_path):
    off, bf16, compile_ = runs
    reference = tmp_path / "reference.json"  # the baseline's step 1 exactly (less a metric), step 2 off by 0.01
    reference.write_text(json.dumps({"rows": {"1": {"reward/mean": -0.10, "time/not_logged": 1.0},
                                              "2": {"reward/mean": -0.08}, "9": {"reward/mean": 0.0}}}))
    result = run_report("report", "--run", "off", str(off), "--run", "bf16", str(bf16), "--run", "compile",
                        str(compile_), "--reference", str(reference), "--json-out", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    runs_ = report["runs"]
    base, fast, comp = runs_["off"], runs_["bf16"], runs_["compile"]
    assert (base["first_step_s"], base["median_step_s"], base["first_step_extra_s"]) == (20.0, 7.0, 13.0)
    assert (base["median_rollout_s"], base["median_train_s"], base["timed_steps"]) == (1.1, 5.25, 2)
    assert (fast["median_step_s"], fast["median_rollout_s"], fast["peak_memory_gib"]) == (5.0, 0.6, 7.0)
    assert base["reward_mean"] == {"1": -0.10, "2": -0.09, "3": -0.08} and base["config"] == {}
    assert (comp["exit_status"], comp["wall_s"], comp["config"]) == (124, 200.0, {"compile_blocks": True})
    assert comp["log_markers"] == {"cuda_graphs_captured": 2, "recompile_limit_hit": 1, "tracebacks": 1}
    assert base["log_markers"] == {"cuda_graphs_captured": 0, "recompile_limit_hit": 0, "tracebacks": 0}

    # stepping: off 1000–1034, bf16 1000–1037, compile 1030–1123; timed steps: off 1020–1026 (beside bf16),
    # 1026–1034 (bf16, compile); bf16 1022–1026 (off), 1026–1031 and 1031–1037 (off, compile); compile 1120–1123
    assert base["concurrent_launches"] == 1.5 and fast["concurrent_launches"] == pytest.approx(5 / 3)
    assert comp["concurrent_launches"] == 0.0

    near = fast["vs_baseline"]
    assert near["rollout"]["latents"]["max_abs_diff"] == 2**-8
    assert near["rollout"]["latents"]["relative_error"] == pytest.approx(2**-8 / 8**0.5, rel=1e-12)
    assert near["rollout"]["media"]["max_abs_diff"] == 2**-10
    assert near["rollout"]["media"]["relative_error"] == pytest.approx(2**-10 * 3**0.5 / (24 / 16) ** 0.5, rel=1e-12)
    assert near["rollout"]["within_tolerance"] is True and near["rollout"]["bit_identical"] is False
    assert near["reward_mean_abs_diff"] == pytest.approx({"1": 0.01, "2": 0.005, "3": 0.01})  # step 4: no baseline
    assert near["median_step_speedup"] == pytest.approx(7.0 / 5.0)
    assert near["median_rollout_speedup"] == pytest.approx(1.1 / 0.6)
    assert comp["vs_baseline"]["rollout"]["latents"]["relative_error"] == pytest.approx(2**-6 / 8**0.5, rel=1e-12)
    assert comp["vs_baseline"]["rollout"]["within_tolerance"] is False
    assert comp["vs_baseline"]["median_step_speedup"] == pytest.approx(7.0 / 3.0)
    assert "off" not in [name for name, run in runs_.items() if "vs_baseline" in run]

    ref = report["baseline_vs_reference"]
    assert ref["steps_compared"] == ["1", "2"] and ref["identical"] is False
    assert ref["max_abs_diff_per_step"] == pytest.approx({"1": 0.0, "2": 0.01})
    assert ref["metrics_missing"] == {"1": ["time/not_logged"]}
    assert result.stdout.splitlines()[1].startswith("bf16     exit 0 steps 4 | first step 22 s, then median 5 s")


def test_a_launch_that_sampled_other_seeds_is_named_and_the_rest_reported(runs, tmp_path):
    off, bf16, _ = runs
    save_file({"latents": torch.ones(2, 1, 2, 2), "media": torch.ones(2, 3, 2, 2), "seeds": torch.tensor([11, 13])},
              str(bf16 / "rollout-dump" / DUMP))
    with open(bf16 / "sana-image-nft" / "logs" / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 5, "wall_ti')  # a launch stopped mid-line
    result = run_report("report", "--run", "off", str(off), "--run", "bf16", str(bf16), "--json-out",
                        str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "r.json").read_text())["runs"]["bf16"]
    error = run["vs_baseline"]["rollout"]["error"]
    assert f"{bf16 / 'rollout-dump' / DUMP}: seeds differ from {off / 'rollout-dump' / DUMP}" in error
    assert run["steps_logged"] == 4 and run["problems"] == [
        f"{bf16 / 'sana-image-nft' / 'logs' / 'metrics.jsonl'}:5: not JSON (Unterminated string starting at)"]


def test_bad_arguments_are_named(runs, tmp_path):
    off, bf16, _ = runs
    missing = run_report("report", "--run", "bf16", str(bf16), "--run", "off", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and f"run 'off': folder {tmp_path / 'nowhere'} does not exist" in missing.stderr
    no_base = run_report("report", "--run", "bf16", str(bf16))
    assert no_base.returncode == 2 and "baseline 'off' is not among the runs (bf16)" in no_base.stderr
    (tmp_path / "bad.json").write_text("[1]")
    bad_ref = run_report("report", "--run", "off", str(off), "--reference", str(tmp_path / "bad.json"))
    assert bad_ref.returncode == 2 and f"reference {tmp_path / 'bad.json'}: not a JSON object with 'rows'" in bad_ref.stderr
    unknown = run_report("overrides", "fast", "--graph-batch", "4")
    assert unknown.returncode == 2 and "unknown configuration 'fast'; one of off, bf16, text_kv" in unknown.stderr


def test_overrides_per_configuration():
    # every feature is set in every configuration, so a recipe's own [custom.rollout.speed] cannot leak in
    assert run_report("overrides", "off", "--graph-batch", "4").stdout.splitlines() == [
        'custom.rollout.speed.linear_attention="fp32"', "custom.rollout.speed.cache_text_kv=false",
        "custom.rollout.speed.compile_blocks=false", "custom.rollout.speed.cuda_graph_max_batch=0",
        "custom.rollout.speed.vae_channels_last=false", "custom.rollout.speed.compile_vae=false"]
    assert run_report("overrides", "recipe", "--graph-batch", "4").stdout.splitlines() == [
        'custom.rollout.speed.linear_attention="bf16"', "custom.rollout.speed.cache_text_kv=true",
        "custom.rollout.speed.compile_blocks=true", "custom.rollout.speed.cuda_graph_max_batch=0",
        "custom.rollout.speed.vae_channels_last=false", "custom.rollout.speed.compile_vae=false"]
    assert run_report("overrides", "all", "--graph-batch", "4").stdout.splitlines() == [
        'custom.rollout.speed.linear_attention="bf16"', "custom.rollout.speed.cache_text_kv=true",
        "custom.rollout.speed.compile_blocks=true", "custom.rollout.speed.cuda_graph_max_batch=4",
        "custom.rollout.speed.vae_channels_last=false", "custom.rollout.speed.compile_vae=false"]


@pytest.mark.slow
def test_dry_run_resolves_each_configuration(tiny_image_pipeline_dir, tmp_path):
    """DRY_RUN=1: every launcher validates its configuration; the resolved configs hold the speed table."""
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps({"rows": {"1": {"reward/mean": -0.1}}}))
    env = {k: v for k, v in os.environ.items() if k not in {"SIZE", "TIMEOUT", "SERIAL", "BUDGET"}}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", WORK=str(tmp_path), OUT=str(tmp_path / "out"),
               MODEL=str(tiny_image_pipeline_dir), DRY_RUN="1", CONFIGS="off all", STEPS="3", REFERENCE=str(reference))
    result = subprocess.run(["bash", str(DEVICE_SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    resolved = {name: tomllib.loads((tmp_path / name / "sana-image-nft" / "sana-image-nft.resolved.toml").read_text())
                for name in ("off", "all")}
    assert resolved["off"]["custom"]["rollout"]["speed"] == {
        "linear_attention": "fp32", "cache_text_kv": False, "compile_blocks": False, "cuda_graph_max_batch": 0,
        "vae_channels_last": False, "compile_vae": False}
    assert resolved["all"]["custom"]["rollout"]["speed"] == {
        "linear_attention": "bf16", "cache_text_kv": True, "compile_blocks": True, "cuda_graph_max_batch": 4,
        "vae_channels_last": False, "compile_vae": False}
    for config in resolved.values():
        assert (config["train"]["max_num_steps"], config["rollout"]["n_generation_mini_batch"]) == (3, 4)
        assert config["policy"]["diffusers"]["inference_size"] == [256, 256]
        assert config["train"]["ckpt"]["enable_checkpoint"] is False
    report = json.loads((tmp_path / "out" / "speed_defaults.json").read_text())
    assert {name: run["exit_status"] for name, run in report["runs"].items()} == {"off": 0, "all": 0}
    assert report["baseline_vs_reference"] == {"reference": str(reference), "steps_compared": [], "steps_missing": ["1"],
                                               "metrics_missing": {}, "max_abs_diff_per_step": {}, "identical": False}


def test_relative_tolerance_sets_the_bar(runs, tmp_path):
    """--relative-tolerance moves the pass mark of the first-step latents (bf16: 2^-8/√8 ≈ 1.4e-3,
    compile: 2^-6/√8 ≈ 5.5e-3 relative); out-of-range values are refused by name."""
    off, bf16, compile_ = runs
    verdicts = {}
    for tolerance in ("0.006", "0.001"):
        out = tmp_path / f"r{tolerance}.json"
        result = run_report("report", "--run", "off", str(off), "--run", "bf16", str(bf16), "--run", "compile",
                            str(compile_), "--relative-tolerance", tolerance, "--json-out", str(out))
        assert result.returncode == 0, result.stderr
        report = json.loads(out.read_text())
        assert report["relative_tolerance"] == float(tolerance)
        verdicts[tolerance] = {name: report["runs"][name]["vs_baseline"]["rollout"]["within_tolerance"]
                               for name in ("bf16", "compile")}
    assert verdicts == {"0.006": {"bf16": True, "compile": True}, "0.001": {"bf16": False, "compile": False}}
    bad = run_report("report", "--run", "off", str(off), "--relative-tolerance", "0")
    assert bad.returncode == 2 and "--relative-tolerance must be between 0 and 1, not 0.0" in bad.stderr
