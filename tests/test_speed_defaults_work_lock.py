"""scripts/device/speed_defaults.sh runs one instance per WORK: each launch starts by deleting
``$WORK/<configuration>``, so a second instance beside the first (another RECIPE and PORT_BASE) on the
same WORK would delete the first one's runs. It stops at once instead, naming WORK."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device" / "speed_defaults.sh"


def run_script(work: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORK": str(work), "CONFIGS": "off", "DRY_RUN": "1", **extra}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_a_second_instance_on_a_work_in_use_stops_before_deleting_anything(tmp_path: Path) -> None:
    kept = tmp_path / "off" / "launch.log"  # a run of the instance already there
    kept.parent.mkdir()
    kept.write_text("running\n")
    with open(tmp_path / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the first instance holds it
        result = run_script(tmp_path, RECIPE="sana-image-grpo", PORT_BASE="10")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (f"WORK {tmp_path} is in use by another speed_defaults.sh; "
                             "give this one its own WORK (and PORT_BASE)\n")
    assert kept.read_text() == "running\n"


def test_a_free_work_goes_on_to_the_next_checks(tmp_path: Path) -> None:
    result = run_script(tmp_path, RECIPE="no-such-recipe")  # refused right after the lock, before any launch
    assert result.returncode == 2
    assert result.stderr == "RECIPE no-such-recipe: no launcher launchers/launch_rl_no-such-recipe.sh\n"
