"""The Sol-RL how-to's command lines with our recipes: ``cosmos-rl --config X.toml cosmos_rl.tools.dataset.diffusion_nft``
(NFT, video NFT) and ``... cosmos_rl.tools.dataset.diffusers_dataset`` (SFT) reach our bridge in every role; any other
upstream dataset script is refused in the launcher with the forms that work."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cosmos_sana.compat import autoload

OURS = '[train]\noutput_dir = "{out}"\n[custom]\npackage = "cosmos-sana"\n'
NFT_SCRIPT = "cosmos_rl.tools.dataset.diffusion_nft"
SFT_SCRIPT = "cosmos_rl.tools.dataset.diffusers_dataset"
BRIDGE_NEEDLE = "cosmos-sana bridge active"


@pytest.fixture
def ours(tmp_path: Path) -> Path:
    path = tmp_path / "ours.toml"
    path.write_text(OURS.format(out=tmp_path / "out"))
    return path


@pytest.mark.parametrize("script", [NFT_SCRIPT, SFT_SCRIPT])
def test_launcher_flags_the_howto_forms(ours: Path, script: str) -> None:
    env: dict[str, str] = {}
    argv = [sys.executable, "/venv/bin/cosmos-rl", "--config", str(ours), script]
    before = list(sys.meta_path)
    try:
        assert autoload.activate(argv, env) == "launcher-flagged" and env[autoload.ENV_FLAG] == "1"
    finally:
        sys.meta_path[:] = before  # the default start-up patches install import hooks in this process


@pytest.mark.parametrize("script", [NFT_SCRIPT, SFT_SCRIPT])
def test_children_redirect_the_howto_scripts(script: str) -> None:
    before = list(sys.meta_path)
    try:
        env = {"COSMOS_ROLE": "Rollout", autoload.ENV_FLAG: "1"}
        assert autoload.activate([sys.executable, "-u", "-m", script, "--config", "x.toml"], env) == "redirect-installed"
        finder = sys.meta_path[0]
        assert isinstance(finder, autoload.EntryRedirectFinder) and finder.target_module == script
    finally:
        sys.meta_path[:] = before
    # without the launcher's flag (a recipe that is not ours) upstream's script runs as it is
    assert autoload.activate([sys.executable, "-m", script], {"COSMOS_ROLE": "Rollout"}) == "inactive"


@pytest.mark.parametrize(
    ("argv_tail", "refused"),
    [
        ([NFT_SCRIPT], None),
        ([SFT_SCRIPT, "--extra", "1"], None),
        (["cosmos_sana.bridge"], None),
        ([], None),
        (["cosmos_rl.tools.dataset.gsm8k_grpo"], "cosmos_rl.tools.dataset.gsm8k_grpo"),
        (["--wfm-mode", "./cosmos_rl/tools/dataset/wfm_rl.py"], "./cosmos_rl/tools/dataset/wfm_rl.py"),
        (["/site/cosmos_rl/tools/dataset/diffusion_nft.py"], "/site/cosmos_rl/tools/dataset/diffusion_nft.py"),
        (["my_project/train.py"], None),
    ],
)
def test_unsupported_upstream_scripts(argv_tail: list[str], refused: str | None) -> None:
    argv = [sys.executable, "/venv/bin/cosmos-rl", "--config", "r.toml", *argv_tail]
    assert autoload.unsupported_script(argv) == refused


def test_other_upstream_script_is_refused_at_once_with_the_working_forms(ours: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (autoload.ENV_FLAG, "COSMOS_ROLE", autoload.DISABLE_FLAG)}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", autoload.LAUNCHER_MODULE, "--config", str(ours), "cosmos_rl.tools.dataset.gsm8k_grpo"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert time.monotonic() - started < 10  # refused at interpreter start, before cosmos-rl is imported
    assert f"{ours} is a cosmos-sana recipe; the script cosmos_rl.tools.dataset.gsm8k_grpo" in out.stderr
    for form in autoload.WORKING_FORMS:
        assert f"  {form}\n" in out.stderr
    assert out.stdout == ""


def _start(role: str, module: str, recipe: Path, log: Path) -> subprocess.Popen:
    """A role started as cosmos-rl's scripts start it for ``cosmos-rl --config X module``: the controller
    as ``python -m module --port P --config X``, the workers through torchrun as ``python -u -m module``."""
    env = {k: v for k, v in os.environ.items() if k not in (autoload.ENV_FLAG, "COSMOS_ROLE", autoload.DISABLE_FLAG)}
    env.update({"COSMOS_ROLE": role, "PYTHONUNBUFFERED": "1", "COSMOS_CONTROLLER_HOST": "127.0.0.1:9",
                autoload.ENV_FLAG: "1"})
    flags = [] if role == "Controller" else ["-u"]
    with log.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, *flags, "-m", module, "--port", "0", "--config", str(recipe)],
            env=env, stdout=sink, stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
def test_howto_scripts_run_our_bridge_in_every_role(ours: Path, tmp_path: Path) -> None:
    # every role, and each script in a worker role (the redirect does not depend on the pairing)
    cases = [("Controller", NFT_SCRIPT), ("Rollout", NFT_SCRIPT), ("Policy", SFT_SCRIPT)]
    logs = [tmp_path / f"{role}-{module.rsplit('.', 1)[1]}.log" for role, module in cases]
    procs = [_start(role, module, ours, log) for (role, module), log in zip(cases, logs)]
    deadline = time.monotonic() + 240  # all start at once on a shared CPU
    try:
        while time.monotonic() < deadline:
            if all(BRIDGE_NEEDLE in log.read_text() or proc.poll() is not None for log, proc in zip(logs, procs)):
                break
            time.sleep(0.5)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for (role, module), log in zip(cases, logs):
        text = log.read_text()
        assert f"{BRIDGE_NEEDLE} in role {role}" in text, f"{role} {module}:\n{text[-3000:]}"
        # upstream's script never ran: it logs this before loading its own prompt set
        assert "Checking dataset at" not in text and "LocalDiffusersDataset" not in text
