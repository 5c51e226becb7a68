"""The launcher's failure report: the first real error of each log, never a shutdown symptom, and a stop by
a signal or timeout named as such."""

from __future__ import annotations

import subprocess
from pathlib import Path

from test_launchers import IMAGE_SFT, fake_validate, launch, workspace  # noqa: F401 (fixture)

#: a cosmos-rl stand-in that writes the worker logs named in $FAKE_LOGS ("NAME=LINE|LINE;...") and exits
#: with $FAKE_STATUS; with FAKE_KILL_GROUP=1 it sends SIGTERM to its whole process group instead, as `timeout` or a
#: scheduler stopping the launch does
LOGGING_COSMOS_RL = """#!/usr/bin/env bash
while (($# > 0)); do [[ $1 == --log-dir ]] && dir=$2; shift; done
mkdir -p "$dir/logs_1"
ln -sfn logs_1 "$dir/logs_latest"
IFS=';' read -ra files <<<"$FAKE_LOGS"
for f in "${files[@]}"; do IFS='|' read -ra lines <<<"${f#*=}"; printf '%s\\n' "${lines[@]}" >"$dir/logs_1/${f%%=*}.log"; done
[[ ${FAKE_KILL_GROUP:-0} == 1 ]] && kill -TERM 0
exit "${FAKE_STATUS:-1}"
"""
SHUTDOWN_CONTROLLER = ("controller=controller up|Traceback (most recent call last):|asyncio.exceptions.CancelledError"
                       "|KeyboardInterrupt")
SHUTDOWN_POLICY = ("policy_0=[rank0]: torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15"
                   "|requests.exceptions.ConnectionError: ('Connection aborted.', ConnectionResetError(104)) during unregister")


def logs_dir(tmp_path: Path) -> Path:
    return (tmp_path / "outputs" / "train" / "sana-image-sft" / "logs" / "logs_1").resolve()


def run_with_logs(workspace: dict[str, str], tmp_path: Path, logs: str, status: int = 1,
                  kill_group: bool = False) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin" / "cosmos-rl"
    fake.write_text(LOGGING_COSMOS_RL)
    env = {**fake_validate(workspace, tmp_path, status=0), "FAKE_LOGS": logs, "FAKE_STATUS": str(status),
           "FAKE_KILL_GROUP": str(int(kill_group))}
    if not kill_group:
        return launch(IMAGE_SFT, env, tmp_path)
    # a session of its own, so that the group kill reaches the launcher and not pytest
    return subprocess.run(["bash", str(IMAGE_SFT)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, start_new_session=True)


def test_shutdown_symptoms_are_skipped_for_the_real_error(workspace: dict[str, str], tmp_path: Path) -> None:
    logs = f"{SHUTDOWN_CONTROLLER};{SHUTDOWN_POLICY};rollout_0=step 1|step 2|ValueError: reward 'hps' got 3 images for 4 prompts"
    result = run_with_logs(workspace, tmp_path, logs)
    assert result.returncode == 1
    assert (f"first error in {logs_dir(tmp_path) / 'rollout_0.log'}:3: ValueError: reward 'hps' got 3 images "
            "for 4 prompts") in result.stderr
    assert result.stderr.count("first error in") == 1, result.stderr
    for noise in ("CancelledError", "KeyboardInterrupt", "SignalException", "ConnectionResetError", "stopped by"):
        assert noise not in result.stderr


def test_only_shutdown_symptoms_are_reported_as_such(workspace: dict[str, str], tmp_path: Path) -> None:
    result = run_with_logs(workspace, tmp_path, SHUTDOWN_CONTROLLER)
    assert (f"only shutdown messages found, the first in {logs_dir(tmp_path) / 'controller.log'}:3: "
            "asyncio.exceptions.CancelledError") in result.stderr
    assert "first error in" not in result.stderr


def test_a_trainer_killed_by_a_signal_is_reported_as_stopped(workspace: dict[str, str], tmp_path: Path) -> None:
    result = run_with_logs(workspace, tmp_path, f"{SHUTDOWN_CONTROLLER};{SHUTDOWN_POLICY}", status=143)
    assert result.returncode == 143
    assert "the launch was stopped by SIGTERM (exit status 143) (a timeout or a scheduler)" in result.stderr
    assert "no error before the stop" in result.stderr
    assert "CancelledError" not in result.stderr and "first error in" not in result.stderr


def test_a_launch_stopped_by_sigterm_says_so_and_keeps_the_earlier_error(workspace, tmp_path: Path) -> None:
    logs = f"{SHUTDOWN_CONTROLLER};policy_0=loading|[rank0]: RuntimeError: NCCL watchdog timed out"
    result = run_with_logs(workspace, tmp_path, logs, status=0, kill_group=True)
    assert result.returncode == 143, result.stderr
    assert "the launch was stopped by SIGTERM (" in result.stderr, result.stderr
    assert f"first error in {logs_dir(tmp_path) / 'policy_0.log'}:2: [rank0]: RuntimeError: NCCL watchdog" in result.stderr
    assert "CancelledError" not in result.stderr


def test_a_trainer_killed_by_sigkill_points_at_the_oom_killer(workspace: dict[str, str], tmp_path: Path) -> None:
    result = run_with_logs(workspace, tmp_path, "policy_0=loading|step 1", status=137)
    assert "stopped by SIGKILL (exit status 137) (the kernel's out-of-memory killer, see dmesg" in result.stderr


#: the worker logs hold no exception; cosmos-rl's own output (the launcher log) does
WORKERS_QUIET_COSMOS_RL = """#!/usr/bin/env bash
while (($# > 0)); do [[ $1 == --log-dir ]] && dir=$2; shift; done
mkdir -p "$dir/logs_1"
ln -sfn logs_1 "$dir/logs_latest"
printf 'controller up\n' > "$dir/logs_1/controller.log"
echo 'ValueError: port 8000 is in use'
exit 1
"""


def test_an_error_only_in_the_launcher_log_is_found_beside_quiet_worker_logs(workspace, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "cosmos-rl"
    fake.write_text(WORKERS_QUIET_COSMOS_RL)
    result = launch(IMAGE_SFT, fake_validate(workspace, tmp_path, status=0), tmp_path)
    log = (tmp_path / "outputs" / "train" / "sana-image-sft" / "logs" / "sana-image-sft_sft.log").resolve()
    number = log.read_text().splitlines().index("ValueError: port 8000 is in use") + 1
    assert f"first error in {log}:{number}: ValueError: port 8000 is in use" in result.stderr, result.stderr
