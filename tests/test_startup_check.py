"""cosmos-rl's policy-worker start-up check with the fast start-up (the default; ``COSMOS_SANA_FAST_STARTUP=0``
switches it off): ``cosmos-sana validate --no-startup-check`` before the launch, the same check in the
controller, and a refused config stopping a launch with the key in the launcher's failure report."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_sana import bridge
from cosmos_sana.compat import autoload
from cosmos_sana.compat import cosmos_rl as compat
from cosmos_sana.config.recipe_file import ConfigInvalid
from cosmos_sana.plugin_manager import installed_plugins
from cosmos_sana.validation import StartupCheckError, check_at_startup, validate_file
from test_launchers import IMAGE_SFT, REPO, launch, workspace  # noqa: F401 (fixture)

TINY_NFT = REPO / "toml" / "tiny" / "sana-image-nft.toml"
RL_NFT = REPO / "launchers" / "launch_rl_sana-image-nft.sh"
UNKNOWN_TRAINER = "train.train_policy.trainer_type=nope_trainer"
#: Diffusion-NFT samples without guidance: only the trainer's own check_config refuses this
NFT_WITH_GUIDANCE = "policy.diffusers.sample.guidance_scale=4.0"
#: stands in for `cosmos-sana validate`: records its arguments (one per line) and writes the --dump copy
RECORDING_COSMOS_SANA = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$FAKE_ARGS"
recipe=$2
while (($# > 1)); do [[ $1 == --dump ]] && cp "$recipe" "$2"; shift; done
exit 0
"""


def _recipe_overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [f"train.output_dir={tmp_path / 'out'}", *extra]


# ----------------------------------------------------------------------------- the checks themselves


def test_no_startup_check_leaves_out_only_the_start_up_check(tmp_path: Path) -> None:
    registry = installed_plugins()
    unknown = _recipe_overrides(tmp_path, UNKNOWN_TRAINER)
    with pytest.raises(ConfigInvalid) as refused:
        validate_file(TINY_NFT, unknown, registry)
    assert [(i.path, i.message) for i in refused.value.issues] == [
        ("train", "cosmos-rl's policy worker would refuse this config: Trainer nope_trainer is not supported.")
    ]
    skipped = validate_file(TINY_NFT, unknown, registry, startup_check=False)
    assert skipped["train"]["train_policy"]["trainer_type"] == "nope_trainer"
    with pytest.raises(ConfigInvalid) as wrong_key:  # every other check still runs
        validate_file(TINY_NFT, [*unknown, "train.epcoh=2"], registry, startup_check=False)
    assert [i.path for i in wrong_key.value.issues] == ["train.epcoh"]


def test_validate_without_the_start_up_check_says_so(tmp_path: Path, capsys) -> None:
    from cosmos_sana.cli import main

    unknown = _recipe_overrides(tmp_path, UNKNOWN_TRAINER)  # would fail the start-up check
    sets = [arg for kv in unknown for arg in ("--set", kv)]
    assert main(["validate", str(TINY_NFT), *sets, "--no-path-check", "--no-startup-check"]) == 0
    assert capsys.readouterr().out == f"{TINY_NFT}: OK (policy-worker start-up check not run)\n"


def test_validate_help_names_the_option() -> None:
    out = subprocess.run([Path(sys.executable).parent / "cosmos-sana", "validate", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--no-startup-check" in out.stdout
    assert "unless COSMOS_SANA_FAST_STARTUP=0" in " ".join(out.stdout.split())


def _resolved(tmp_path: Path, *overrides: str) -> Path:
    """The tiny NFT recipe with ``overrides``, as the launcher's ``--dump`` writes it."""
    import tomli_w

    from cosmos_sana.validation import load_toml

    path = tmp_path / "run.toml"
    path.write_bytes(tomli_w.dumps(load_toml(TINY_NFT, _recipe_overrides(tmp_path, *overrides))).encode())
    return path


@pytest.mark.parametrize(
    ("override", "named"),
    [
        (UNKNOWN_TRAINER, "train.train_policy.trainer_type = 'nope_trainer': the start-up check refused the config: "
                          "train: cosmos-rl's policy worker would refuse this config: Trainer nope_trainer is not supported."),
        (NFT_WITH_GUIDANCE, "train.train_policy.trainer_type = 'sana_nft': the start-up check refused the config: "
                            "trainer 'sana_nft': policy.diffusers.sample.guidance_scale = 4.0: Diffusion-NFT trains"),
    ],
)
def test_the_controller_check_raises_one_line_naming_the_key(tmp_path: Path, override: str, named: str) -> None:
    with pytest.raises(StartupCheckError) as refused:
        check_at_startup(_resolved(tmp_path, override), installed_plugins())
    assert str(refused.value).startswith(named)
    assert "\n" not in str(refused.value)
    check_at_startup(_resolved(tmp_path), installed_plugins())  # the recipe as shipped passes


@pytest.mark.parametrize(("flag", "checked"), [("1", True), (None, True), ("0", False)])
def test_the_controller_role_checks_unless_the_fast_start_up_is_off(tmp_path: Path, monkeypatch, flag, checked) -> None:
    """cosmos-rl's controller main is replaced by a recorder (it would serve HTTP): the check decides
    whether the controller gets to start."""
    started: list[dict] = []
    monkeypatch.setenv("COSMOS_ROLE", "Controller")
    if flag is None:
        monkeypatch.delenv(autoload.FAST_STARTUP_FLAG, raising=False)
    else:
        monkeypatch.setenv(autoload.FAST_STARTUP_FLAG, flag)
    config_path = _resolved(tmp_path, UNKNOWN_TRAINER)
    monkeypatch.setattr(compat, "controller_config", lambda: (argparse.Namespace(config=str(config_path)), None))
    monkeypatch.setattr(bridge, "controller_kwargs", lambda registry, config: {})
    monkeypatch.setattr(compat, "run_controller", lambda **kwargs: started.append(kwargs))
    if checked:
        with pytest.raises(StartupCheckError, match="train.train_policy.trainer_type = 'nope_trainer'"):
            bridge.main()
        assert started == []
    else:
        bridge.main()
        assert len(started) == 1


# ----------------------------------------------------------------------------- the launcher


def _recording(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "bin" / "cosmos-sana"
    fake.write_text(RECORDING_COSMOS_SANA)
    fake.chmod(0o755)
    return {**env, "COSMOS_SANA": str(fake), "FAKE_ARGS": str(tmp_path / "validate-args")}


@pytest.mark.parametrize(
    ("env", "args", "skipped"),
    [
        ({}, [], True),
        ({autoload.FAST_STARTUP_FLAG: ""}, [], True),
        ({autoload.FAST_STARTUP_FLAG: "1"}, [], True),
        ({autoload.FAST_STARTUP_FLAG: "0"}, [], False),
        ({"DRY_RUN": "1"}, [], False),
        ({}, ["--dry-run"], False),
    ],
)
def test_the_launcher_leaves_the_check_to_the_controller_unless_switched_off(workspace, tmp_path: Path, env, args,
                                                                             skipped: bool) -> None:
    base = {k: v for k, v in _recording(workspace, tmp_path).items() if k != autoload.FAST_STARTUP_FLAG}
    result = launch(IMAGE_SFT, {**base, **env}, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    called = (tmp_path / "validate-args").read_text().splitlines()
    resolved = tmp_path / "outputs" / "train" / "sana-image-sft" / "sana-image-sft.resolved.toml"
    assert called[:2] == ["validate", str(REPO / "toml" / "sana-image-sft.toml")]
    assert called[-2:] == ["--dump", str(resolved)]
    assert ("--no-startup-check" in called) is skipped
    if skipped:  # otherwise the same command as with the fast start-up switched off
        off = launch(IMAGE_SFT, {**base, autoload.FAST_STARTUP_FLAG: "0"}, tmp_path)
        assert off.returncode == 0, off.stderr
        full = (tmp_path / "validate-args").read_text().splitlines()
        assert "--no-startup-check" not in full
        assert [a for a in called if a != "--no-startup-check"] == full


@pytest.mark.parametrize("value", ["true", "2"])
def test_the_launcher_refuses_any_other_value_of_the_flag(workspace, tmp_path: Path, value: str) -> None:
    env = {**_recording(workspace, tmp_path), autoload.FAST_STARTUP_FLAG: value}
    result = launch(IMAGE_SFT, env, tmp_path, "--dry-run")
    assert result.returncode == 2
    assert (f"error: COSMOS_SANA_FAST_STARTUP={value}: use 0 (cosmos-rl's own start-up and shutdown) or 1 "
            "(cosmos-sana's start-up patches, also what unset means)") in result.stderr
    assert not (tmp_path / "validate-args").exists()  # refused before validating


def test_a_default_dry_run_keeps_the_full_check(workspace, tmp_path: Path) -> None:
    env = {k: v for k, v in workspace.items() if k != autoload.FAST_STARTUP_FLAG}
    result = launch(IMAGE_SFT, env, tmp_path, "--dry-run", "--", UNKNOWN_TRAINER)  # the real `cosmos-sana validate`
    assert result.returncode != 0
    assert "train: cosmos-rl's policy worker would refuse this config: Trainer nope_trainer is not supported." in result.stdout
    assert "does not validate" in result.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_a_default_launch_with_an_unknown_trainer_stops_with_the_key_named(tiny_image_pipeline_dir: Path,
                                                                          tmp_path: Path) -> None:
    """A real launch on CPU (a fake ``nvidia-smi`` lets cosmos-rl's launcher start): validation passes
    without the start-up check, the replica starts beside the controller, the controller's check refuses
    the trainer type, and cosmos-rl's launcher stops the replica; the launch ends with status 1 and the
    launcher names the controller's error line instead of waiting."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_") and k != "DRY_RUN"}
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}", PYTHONUNBUFFERED="1",
        TOML_FILE=str(TINY_NFT), DATASET_PATH="builtin:demo", BASE_CHECKPOINT_PATH=str(tiny_image_pipeline_dir),
        NPROC_PER_NODE="1", OUTPUT_ROOT="runs", MASTER_PORT=str(_free_port()), RDZV_PORT=str(_free_port()),
    )
    command = ["bash", str(RL_NFT), "--", UNKNOWN_TRAINER, f'redis="{_free_port()}"']
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                            start_new_session=True)
    assert result.returncode == 1, result.stderr[-3000:]
    logs = (tmp_path / "runs" / "sana-image-nft" / "logs" / "logs_latest").resolve()
    cause = f"first error in {logs / 'controller.log'}:"
    assert cause in result.stderr, result.stderr[-3000:]
    line = next(line for line in result.stderr.splitlines() if cause in line)
    assert line.endswith(": cosmos_sana.validation.StartupCheckError: train.train_policy.trainer_type = 'nope_trainer': "
                         "the start-up check refused the config: train: cosmos-rl's policy worker would refuse this "
                         "config: Trainer nope_trainer is not supported.")
    assert "Launching process with command" in result.stdout and "--type policy" in result.stdout  # the replica had started
