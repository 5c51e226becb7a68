"""A COSMOS_SANA_FAST_STARTUP value other than 0 or 1 is refused by ``cosmos-sana run --local`` too, as
by the launchers and cosmos-rl's launcher: status 2 and the variable named, before anything is written.
A local run goes through no launcher; the refusal comes from its validation (the start-up check
registers our components with cosmos-rl, which reads the flag)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_run_local_refuses_a_bad_flag_before_writing_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_")}
    env["COSMOS_SANA_FAST_STARTUP"] = "yes"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cosmos-sana"), "run", "toml/tiny/sana-image-nft.toml", "--local"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (
        "error: COSMOS_SANA_FAST_STARTUP='yes': use 0 (cosmos-rl's own start-up and shutdown) or 1 "
        "(cosmos-sana's start-up patches, also what unset means)"
    )
    assert result.stdout == "" and list(tmp_path.iterdir()) == []
