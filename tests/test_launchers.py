"""The SFT/RL launch scripts: path checks, dry run, overrides, env defaults, exit status, shellcheck."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAUNCHERS = REPO / "launchers"
IMAGE_SFT = LAUNCHERS / "launch_sft_sana-image-sft.sh"
VIDEO_SFT = LAUNCHERS / "launch_sft_sana-video-sft-lora.sh"
FAKE_COSMOS_RL = """#!/usr/bin/env bash
echo "fake cosmos-rl $*"
touch "$FAKE_MARK"
exit "${FAKE_STATUS:-0}"
"""
#: stands in for `cosmos-sana validate` where the real one (its imports take 15 s) is not what is tested
FAKE_COSMOS_SANA = """#!/usr/bin/env bash
[[ $1 == validate ]] || exit 64
recipe=$2
while (($# > 1)); do [[ $1 == --dump ]] && cp "$recipe" "$2"; shift; done
exit "${FAKE_VALIDATE_STATUS:-0}"
"""


@pytest.fixture
def workspace(tmp_path: Path) -> dict[str, str]:
    """A caller's working directory with data, a pipeline folder and a fake ``cosmos-rl``."""
    (tmp_path / "data").mkdir()
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "model_index.json").write_text('{"_class_name": "SanaPipeline", "vae": ["diffusers", "AutoencoderDC"]}')
    (tmp_path / "base" / "vae").mkdir()
    fake = tmp_path / "bin" / "cosmos-rl"
    fake.parent.mkdir()
    fake.write_text(FAKE_COSMOS_RL)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATASET_PATH", "VAL_DATASET_PATH", "BASE_CHECKPOINT_PATH", "OUTPUT_ROOT", "DRY_RUN"}}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        COSMOS_RL=str(fake),
        FAKE_MARK=str(tmp_path / "cosmos-rl-ran"),
        DATASET_PATH="data",
        VAL_DATASET_PATH="data",
        BASE_CHECKPOINT_PATH="base",
        NPROC_PER_NODE="2",
    )
    return env


def launch(script: Path, env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is required (apt-get install shellcheck)"
    scripts = sorted(str(p) for p in LAUNCHERS.glob("*.sh"))
    result = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_missing_dataset_is_named_and_fails_dry_run(workspace: dict[str, str], tmp_path: Path) -> None:
    workspace["DATASET_PATH"] = "nope/data"
    result = launch(IMAGE_SFT, workspace, tmp_path, "--dry-run")
    assert result.returncode != 0
    assert f"DATASET_PATH={tmp_path}/nope/data does not exist" in result.stderr
    assert not (tmp_path / "cosmos-rl-ran").exists()


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"BASE_CHECKPOINT_PATH": "data"}, [], "is not a diffusers pipeline folder"),
        ({}, ["--bogus"], "unknown argument '--bogus'"),
        ({}, ["--", "no-equals-sign"], "must look like key.path=value"),
        ({"NNODES": "2"}, [], "needs MASTER_ADDR"),
        ({"INIT_DCP_PATH": "data"}, [], "convert-to-dcp"),
    ],
)
def test_bad_settings_fail_before_validation(workspace, tmp_path: Path, env, args, message) -> None:
    result = launch(IMAGE_SFT, {**workspace, **env}, tmp_path, *args)
    assert result.returncode != 0 and message in result.stderr


def test_native_video_requires_wan_vae(workspace: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "native.pth").write_bytes(b"")
    workspace["NATIVE_CHECKPOINT_PATH"] = "native.pth"
    result = launch(VIDEO_SFT, workspace, tmp_path, "--dry-run")
    assert result.returncode != 0 and "export WAN_VAE_PATH=" in result.stderr
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text('{"_class_name": "AutoencoderDC"}')
    result = launch(VIDEO_SFT, {**workspace, "WAN_VAE_PATH": "vae"}, tmp_path, "--dry-run")
    assert result.returncode != 0 and f"WAN_VAE_PATH={tmp_path}/vae is not a Wan VAE folder" in result.stderr


def fake_validate(env: dict[str, str], tmp_path: Path, status: int) -> dict[str, str]:
    fake = tmp_path / "bin" / "cosmos-sana"
    fake.write_text(FAKE_COSMOS_SANA)
    fake.chmod(0o755)
    return {**env, "COSMOS_SANA": str(fake), "FAKE_VALIDATE_STATUS": str(status)}


def test_dry_run_resolves_env_and_overrides_without_launching(workspace: dict[str, str], tmp_path: Path) -> None:
    env = {**workspace, "OUTPUT_ROOT": "runs", "DRY_RUN": "1"}
    result = launch(IMAGE_SFT, env, tmp_path, "--", "train.epoch=7")  # the real `cosmos-sana validate`
    assert result.returncode == 0, result.stderr
    assert "dry run" in result.stdout and not (tmp_path / "cosmos-rl-ran").exists()
    run_dir = tmp_path / "runs" / "sana-image-sft"
    resolved = tomllib.loads((run_dir / "sana-image-sft.resolved.toml").read_text())
    assert resolved["train"]["epoch"] == 7
    assert resolved["train"]["output_dir"] == str(run_dir)
    assert resolved["policy"]["model_name_or_path"] == str(tmp_path / "base")
    assert resolved["custom"]["data"]["args"]["path"] == str(tmp_path / "data")
    assert resolved["custom"]["val_data"]["args"]["path"] == str(tmp_path / "data")
    assert resolved["policy"]["parallelism"]["dp_shard_size"] == 2  # NPROC_PER_NODE=2 overrides the default 8


def test_launch_returns_trainer_status_and_tees_log(workspace: dict[str, str], tmp_path: Path) -> None:
    env = fake_validate({**workspace, "FAKE_STATUS": "3", "MASTER_PORT": "8123"}, tmp_path, status=0)
    result = launch(IMAGE_SFT, env, tmp_path)
    assert result.returncode == 3, result.stderr
    run_dir = tmp_path / "outputs" / "train" / "sana-image-sft"
    expected = f"fake cosmos-rl --config {run_dir}/sana-image-sft.resolved.toml --port 8123"
    assert expected in result.stdout and result.stdout.rstrip().endswith("cosmos_sana.bridge")
    assert expected in (run_dir / "logs" / "sana-image-sft_sft.log").read_text()


def test_validation_failure_stops_the_launch(workspace: dict[str, str], tmp_path: Path) -> None:
    result = launch(IMAGE_SFT, fake_validate(workspace, tmp_path, status=1), tmp_path)
    assert result.returncode != 0 and "does not validate" in result.stderr
    assert not (tmp_path / "cosmos-rl-ran").exists()


def test_dry_run_refuses_missing_validation_data_only_when_validation_is_on(workspace, tmp_path: Path) -> None:
    """The recipe's default ``data/sft/val`` is missing here: the dry run says so (the launch used to
    die in the workers instead); with validation off the same data is fine."""
    env = {k: v for k, v in workspace.items() if k != "VAL_DATASET_PATH"}
    result = launch(IMAGE_SFT, env, tmp_path, "--dry-run")
    assert result.returncode != 0
    assert f"custom.val_data.args.path: 'data/sft/val' does not exist (relative to {tmp_path})" in result.stdout
    result = launch(IMAGE_SFT, env, tmp_path, "--dry-run", "--", "validation.enable=false")
    assert result.returncode == 0, result.stdout + result.stderr


FAILING_COSMOS_RL = """#!/usr/bin/env bash
while (($# > 0)); do [[ $1 == --log-dir ]] && dir=$2; shift; done
mkdir -p "$dir/logs_1"
ln -sfn logs_1 "$dir/logs_latest"
printf 'controller up\nworker exited\n' > "$dir/logs_1/controller.log"
printf '%s\n' 'loading model' 'Traceback (most recent call last):' '  File "x.py", line 1, in <module>' \
  '[rank0]: FileNotFoundError: [Errno 2] No such file: data/sft/val' 'RuntimeError: later noise' > "$dir/logs_1/policy_0.log"
exit 1
"""


def test_a_failed_launch_prints_the_first_error_of_each_log(workspace: dict[str, str], tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "cosmos-rl"
    fake.write_text(FAILING_COSMOS_RL)
    result = launch(IMAGE_SFT, fake_validate(workspace, tmp_path, status=0), tmp_path)
    assert result.returncode == 1
    logs = tmp_path / "outputs" / "train" / "sana-image-sft" / "logs" / "logs_1"
    assert (f"first error in {logs / 'policy_0.log'}:4: [rank0]: FileNotFoundError: [Errno 2] No such file: "
            "data/sft/val") in result.stderr
    assert "later noise" not in result.stderr and "controller.log" not in result.stderr
    assert "trainer exited with status 1" in result.stderr


def test_launcher_hint_names_the_data_check_command(workspace: dict[str, str], tmp_path: Path) -> None:
    result = launch(IMAGE_SFT, {**workspace, "DATASET_PATH": "nope"}, tmp_path, "--dry-run")
    assert f"check it with: cosmos-sana data check {tmp_path}/nope" in result.stderr


EARLY_FAILING_COSMOS_RL = """#!/usr/bin/env bash
echo 'Traceback (most recent call last):'
echo 'RuntimeError: No GPUs available. Please check your GPU configuration.'
exit 1
"""


def test_a_launch_that_fails_before_its_workers_names_the_launcher_log_line(workspace, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "cosmos-rl"
    fake.write_text(EARLY_FAILING_COSMOS_RL)
    env = fake_validate(workspace, tmp_path, status=0)
    log = tmp_path / "outputs" / "train" / "sana-image-sft" / "logs" / "sana-image-sft_sft.log"
    launch(IMAGE_SFT, env, tmp_path)  # a first launch: the log keeps its lines
    before = len(log.read_text().splitlines())
    result = launch(IMAGE_SFT, env, tmp_path)
    assert result.returncode == 1
    lines = log.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if i > before and line.startswith("RuntimeError"))
    assert f"first error in {log}:{number}: RuntimeError: No GPUs available" in result.stderr
