"""``cosmos-sana run RECIPE --local``: a run SIGKILLed right after checkpoint 3 and resumed ends
bit-identical to an uninterrupted run (NFT: LoRA default + old, EMA; SFT: LoRA, EMA, validation)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from cosmos_sana.checkpoint import list_checkpoints
from cosmos_sana.checkpoint.training import changed_settings
from cosmos_sana.cli import main

REPO = Path(__file__).resolve().parents[1]
STEPS, KILL_AFTER = 6, 3
#: metrics that measure time, not training
TIMING = ("wall_time", "train/iteration_time")


def compare_script():
    spec = importlib.util.spec_from_file_location("compare_checkpoints", REPO / "scripts" / "compare_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_args(recipe: str, pipeline: Path, output_dir: Path, extra: list[str]) -> list[str]:
    sets = {
        "policy.model_name_or_path": json.dumps(str(pipeline)),
        "train.output_dir": json.dumps(str(output_dir)),
        "train.max_num_steps": STEPS,
        "train.ckpt.save_freq": KILL_AFTER,
        "train.ckpt.max_keep": -1,
        "train.ema_enable": "true",
        "custom.model.device": '"cpu"',
        "custom.logging.progress_bar": "false",
    }
    args = ["run", recipe, "--local"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    for item in extra:
        args += ["--set", item]
    return args


def run_killed_after_checkpoint(args: list[str], output_dir: Path) -> None:
    """Run in a subprocess and SIGKILL it as soon as checkpoint ``KILL_AFTER`` is COMPLETE."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # as torch_single_thread in-process
    proc = subprocess.Popen(
        [sys.executable, "-m", "cosmos_sana.cli", *args], cwd=REPO, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    marker = f"checkpoints/iter_{KILL_AFTER:09d}/COMPLETE"
    deadline = time.monotonic() + 300
    try:
        while not list(output_dir.glob(f"*/{marker}")):
            if proc.poll() is not None:
                pytest.fail(f"the run ended (rc {proc.returncode}) before checkpoint {KILL_AFTER}:\n{proc.stderr.read().decode()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no checkpoint {KILL_AFTER} after 300 s")
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    saved = [p.name for run in output_dir.iterdir() for p in list_checkpoints(run)]
    assert saved == [f"iter_{KILL_AFTER:09d}"], f"killed too late to test resuming: {saved}"


def metrics(output_dir: Path) -> dict[int, dict]:
    """Step → logged metrics (timing left out) over every run folder, oldest folder first."""
    rows = {}
    for path in sorted(output_dir.glob("*/logs/metrics.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[row["step"]] = {k: v for k, v in row.items() if k not in TIMING and not k.startswith("time/")}
    return rows


def check_resume_is_exact(recipe: str, pipeline: Path, tmp_path: Path, capsys, extra: list[str]) -> dict:
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(run_args(recipe, pipeline, full, extra)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["first_step"], summary["last_step"], summary["steps_run"]) == (1, STEPS, STEPS)

    run_killed_after_checkpoint(run_args(recipe, pipeline, cut, extra), cut)
    # a resume started within the same second as the killed run shares its <timestamp> folder
    # (cosmos-rl names run folders by the second), so only the lines it adds are its own
    logged_before = {path: len(path.read_text().splitlines()) for path in cut.glob("*/logs/metrics.jsonl")}
    assert main(run_args(recipe, pipeline, cut, [*extra, "train.resume=true"])) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["first_step"], summary["last_step"], summary["steps_run"]) == (KILL_AFTER + 1, STEPS, STEPS - KILL_AFTER)
    resumed_log = Path(summary["output_dir"]) / "logs" / "metrics.jsonl"
    added = resumed_log.read_text().splitlines()[logged_before.get(resumed_log, 0):]
    assert [json.loads(line)["step"] for line in added] == [4, 5, 6]  # no replay

    resumed_from = next(cut.glob(f"*/checkpoints/iter_{KILL_AFTER:09d}"))
    resumed_config = json.loads((Path(summary["checkpoint"]) / "run_config.json").read_text())
    assert changed_settings(resumed_from, resumed_config) == []  # the resume warned of no setting

    assert compare_script().main([str(full), str(cut)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bit_identical"] and report["a"].endswith(f"iter_{STEPS:09d}") and report["b"].endswith(f"iter_{STEPS:09d}")
    expected, resumed = metrics(full), metrics(cut)
    for step in range(KILL_AFTER + 1, STEPS + 1):
        assert resumed[step] == expected[step], f"step {step} metrics differ"
    return report


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_nft_resumed_after_sigkill_matches_the_uninterrupted_run(tiny_image_pipeline_dir, tmp_path, capsys):
    extra = ["rollout.n_generation=2", "train.train_batch_per_replica=4", "train.train_policy.mini_batch=4",
             "policy.diffusers.sample.num_steps=2"]
    report = check_resume_is_exact("toml/tiny/sana-image-nft.toml", tiny_image_pipeline_dir, tmp_path, capsys, extra)
    groups = report["groups"]
    assert groups["model/lora_default"]["entries"] == groups["model/lora_old"]["entries"] == 32  # 8 modules × 2 blocks × A, B
    assert {"ema/lora_default", "optim/lora_default", "rng", "scheduler", "trainer"} <= set(groups)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_sft_resumed_mid_epoch_after_sigkill_matches_the_uninterrupted_run(tiny_image_pipeline_dir, tmp_path, capsys):
    data = tmp_path / "images"
    data.mkdir()
    for i in range(4):  # batch 1: 4 steps an epoch, so the resume lands mid-epoch and step 5 starts epoch 2
        Image.new("RGB", (48, 40), (60 * i, 255 - 60 * i, 128)).save(data / f"s{i}.png")
        (data / f"s{i}.txt").write_text(f"a flat colour number {i}\n")
    extra = ["train.train_batch_per_replica=1", "train.train_policy.mini_batch=1", "validation.freq=2",
             f"custom.data.args.path={json.dumps(str(data))}", f"custom.val_data.args.path={json.dumps(str(data))}"]
    report = check_resume_is_exact("toml/tiny/sana-image-sft-lora.toml", tiny_image_pipeline_dir, tmp_path, capsys, extra)
    assert {"model/lora_default", "ema/lora_default", "optim/lora_default", "rng", "scheduler", "trainer"} <= set(report["groups"])


def test_run_needs_local(capsys):
    assert main(["run", "toml/tiny/sana-image-nft.toml"]) == 2
    assert "--local" in capsys.readouterr().err


def test_run_names_an_unknown_override_key(capsys):
    assert main(["run", "toml/tiny/sana-image-nft.toml", "--local", "--set", "train.max_num_stepz=3"]) == 1
    assert "train.max_num_stepz" in capsys.readouterr().err


def test_run_names_a_missing_recipe(capsys):
    assert main(["run", "toml/tiny/nope.toml", "--local"]) == 2
    assert "nope.toml" in capsys.readouterr().err


@pytest.mark.usefixtures("torch_single_thread")
@pytest.mark.parametrize("recipe", ["toml/tiny/sana-video-nft.toml", "toml/tiny/sana-video-sft-lora.toml"])
def test_run_local_trains_video_recipes(recipe, tiny_video_pipeline_dir, tmp_path, capsys):
    from test_trainer_sft import video_folder

    clips = json.dumps(str(video_folder(tmp_path / "clips")))
    extra = [f"custom.data.args.path={clips}", f"custom.val_data.args.path={clips}", "train.train_batch_per_replica=2",
             "validation.enable=false"] if "sft" in recipe else ["policy.diffusers.sample.num_steps=2"]
    args = run_args(recipe, tiny_video_pipeline_dir, tmp_path / "out", [*extra, "train.max_num_steps=2", "train.ckpt.save_freq=2"])
    assert main(args) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["first_step"], summary["last_step"], summary["steps_run"]) == (1, 2, 2)
    assert summary["checkpoint"].endswith("iter_000000002")
    assert summary["export"] == str(Path(summary["output_dir"]) / "safetensors" / "step_2")
    assert any(Path(summary["export"]).iterdir())
    assert f"[run] step 2 of 2 done: checkpoint {summary['checkpoint']}, export {summary['export']}" in err
    assert (Path(summary["output_dir"]) / "logs" / "metrics.jsonl").read_text().count("\n") == 2


@pytest.mark.usefixtures("torch_single_thread")
def test_a_resume_with_nothing_left_names_the_restored_checkpoint(tiny_image_pipeline_dir, tmp_path, capsys):
    """Resuming a finished run trains nothing; the summary still names the checkpoint and export it holds."""
    args = run_args("toml/tiny/sana-image-nft.toml", tiny_image_pipeline_dir, tmp_path / "out",
                    ["train.max_num_steps=1", "policy.diffusers.sample.num_steps=2"])
    assert main(args) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    time.sleep(1.1)  # run folders are named by the second: the resume gets a folder of its own
    assert main([*args, "--set", "train.resume=true"]) == 0
    out, err = capsys.readouterr()
    again = json.loads(out.strip().splitlines()[-1])
    assert again["output_dir"] != done["output_dir"] and (again["steps_run"], again["last_step"]) == (0, 1)
    assert (again["checkpoint"], again["export"]) == (done["checkpoint"], done["export"]) != (None, None)
    assert f"[run] step 1 of 1 done: checkpoint {done['checkpoint']}, export {done['export']}" in err


@pytest.mark.usefixtures("torch_single_thread")
def test_a_resume_from_another_kind_of_run_is_refused_by_name(tiny_image_pipeline_dir, tmp_path, capsys):
    """An NFT recipe pointed at a GRPO run's folder: the trainer and its LoRA adapters differ, so the
    resume is refused before anything loads or trains (a partial load would skip NFT's ``old`` adapter)."""
    out = tmp_path / "out"
    assert main(run_args("toml/tiny/sana-image-grpo.toml", tiny_image_pipeline_dir, out, ["train.max_num_steps=1"])) == 0
    grpo = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    args = run_args("toml/tiny/sana-image-nft.toml", tiny_image_pipeline_dir, out, ["train.max_num_steps=2", "train.resume=true"])
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"error: train.resume: {grpo['checkpoint']} was written by another kind of run (" in err
    assert "policy.lora.lora_names" in err and "train.train_policy.trainer_type" in err and "Traceback" not in err
    assert [p.name for p in out.glob("*/checkpoints/iter_*")] == ["iter_000000001"]


def test_a_tripped_guard_stops_the_run_with_its_message_and_no_traceback(tiny_image_pipeline_dir, tmp_path, capsys):
    """A deliberate stop (here a reward-hacking guard: any saturation is over 1e-6) is one message
    on stderr and exit status 1, not a traceback; nothing is checkpointed past it."""
    args = run_args("toml/tiny/sana-image-grpo.toml", tiny_image_pipeline_dir, tmp_path / "out",
                    ["train.max_num_steps=2", "custom.guards.max_saturation=1e-6"])
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "stopped: guard: saturation = " in err and "> 1e-06 at step 1" in err, err[-2000:]
    assert "Traceback" not in err
    assert not [p for run in (tmp_path / "out").iterdir() for p in list_checkpoints(run)]
