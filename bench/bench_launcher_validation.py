"""The launcher's pre-launch step (``cosmos-sana validate ... --dump``, run before every launch): wall and
CPU time of ``bash launchers/launch_rl_sana-image-nft.sh`` in a caller's folder set up as
``tests/test_launchers.py`` sets it up (a data file, a pipeline folder with its ``model_index.json``,
a stand-in ``cosmos-rl`` that exits at once, so the time is the step's); prints JSON.

    python bench/bench_launcher_validation.py [--repeats 3] [--before-tree DIR] [--json-out FILE]

Cases: ``valid`` (the recipe as shipped: every check passes) and ``wrong_key`` (``-- train.epcoh=2``:
refused by the key checks). Variants, each setting the flag explicitly so that an inherited value cannot
change a side: ``after`` (this tree with ``COSMOS_SANA_FAST_STARTUP=0``, cosmos-rl's own start-up:
cosmos-rl's policy-worker start-up check runs here); ``fast_startup`` (this tree with
``COSMOS_SANA_FAST_STARTUP=1``, the default: the launcher passes ``--no-startup-check`` and the
controller runs that check instead); ``before`` with
``--before-tree DIR``, a copy of an older ``cosmos_sana`` and ``plugins`` (``git archive REV cosmos_sana
plugins | tar -x -C DIR``) put first on ``PYTHONPATH``. Each command runs once to warm the file cache,
then ``--repeats`` times, the variants interleaved so that a shared machine slows them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "launchers" / "launch_rl_sana-image-nft.sh"
CASES = {"valid": (), "wrong_key": ("--", "train.epcoh=2")}
#: the launcher's exit status per case (2: it stops with "does not validate")
EXPECTED_STATUS = {"valid": 0, "wrong_key": 2}
FAST_STARTUP_FLAG = "COSMOS_SANA_FAST_STARTUP"


def workspace(root: Path) -> dict[str, str]:
    """A caller's folder and the launcher's environment (as in ``tests/test_launchers.py``)."""
    (root / "base" / "vae").mkdir(parents=True)
    (root / "base" / "model_index.json").write_text('{"_class_name": "SanaPipeline", "vae": ["diffusers", "AutoencoderDC"]}')
    (root / "prompts.txt").write_text("a red cube\n")
    (root / "bin").mkdir()
    fake = root / "bin" / "cosmos-rl"
    fake.write_text("#!/usr/bin/env bash\nexit 0\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_") and k != "DRY_RUN"}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        COSMOS_RL=str(fake),
        DATASET_PATH="prompts.txt",
        BASE_CHECKPOINT_PATH="base",
        NPROC_PER_NODE="2",
        OUTPUT_ROOT="runs",
    )
    return env


def variant_envs(env: dict[str, str], before_tree: Path | None) -> dict[str, dict[str, str]]:
    envs = {"after": {**env, FAST_STARTUP_FLAG: "0"}, "fast_startup": {**env, FAST_STARTUP_FLAG: "1"}}
    if before_tree is not None:
        # first on the path; the rest of it stays (a device install puts its packages there)
        path = os.pathsep.join(p for p in (str(before_tree), str(before_tree / "plugins"), env.get("PYTHONPATH")) if p)
        envs["before"] = {**env, "PYTHONPATH": path}
    return envs


def timed(args: tuple[str, ...], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """``(wall s, CPU s of the launcher and everything it ran, exit status)``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(["bash", str(LAUNCHER), *args], env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before-tree", type=Path)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        envs = variant_envs(workspace(root), args.before_tree)
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {case: {v: [] for v in envs} for case in CASES}
        for repeat in range(args.repeats + 1):  # the first round warms the file cache and is dropped
            for case, case_args in CASES.items():
                for variant, env in envs.items():
                    wall, cpu, status = timed(case_args, env, root)
                    if status != EXPECTED_STATUS[case]:
                        raise SystemExit(f"{case}/{variant}: launcher exited {status}, expected {EXPECTED_STATUS[case]}")
                    if repeat:
                        samples[case][variant].append((round(wall, 2), round(cpu, 2)))
    report = {
        "bench": "launcher_validation",
        "command": f"{FAST_STARTUP_FLAG}=0|1 bash {LAUNCHER.relative_to(REPO)} [-- train.epcoh=2]",
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cases": {
            case: {
                variant: {
                    "wall_s": [w for w, _ in pairs],
                    "cpu_s": [c for _, c in pairs],
                    "median_wall_s": round(statistics.median(w for w, _ in pairs), 2),
                    "median_cpu_s": round(statistics.median(c for _, c in pairs), 2),
                }
                for variant, pairs in by_variant.items()
            }
            for case, by_variant in samples.items()
        },
    }
    text = json.dumps(report, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
