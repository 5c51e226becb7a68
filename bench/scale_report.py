"""Scaling table of RL launches on 1, 2, 4, 8 GPUs from their ``metrics.jsonl`` (rank 0's run log).

    python bench/scale_report.py metrics-n1.jsonl metrics-n2.jsonl ... --per-gpu-batch 16 [--json-out s.json]

Each file is named ``...-n<GPUS>.jsonl``. Steady state = every step but the first (warm-up) and the
last (final checkpoint and export); medians of the ``time/*`` split the trainer logs, the peak of
``memory/peak_gib``. Scaling efficiency = samples/s on N GPUs / (N × samples/s on 1 GPU).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

PARTS = ("step", "rollout", "reward_wait", "train", "other")


def gpus_of(path: Path) -> int:
    match = re.search(r"-n(\d+)\.jsonl$", path.name)
    if match is None:
        raise ValueError(f"{path}: name it ...-n<GPUS>.jsonl")
    return int(match.group(1))


def summarise(path: Path, per_gpu_batch: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steady = rows[1:-1]
    if not steady:
        raise ValueError(f"{path}: {len(rows)} steps logged; need at least 3 (warm-up, steady, final)")
    missing = [f"time/{p}_s" for p in PARTS if any(f"time/{p}_s" not in row for row in steady)]
    if missing:
        raise ValueError(f"{path}: rows without {missing} (a run log from before the step clock?)")
    gpus = gpus_of(path)
    split = {f"{p}_s": statistics.median(row[f"time/{p}_s"] for row in steady) for p in PARTS}
    peaks = [row["memory/peak_gib"] for row in rows if "memory/peak_gib" in row]
    return {
        "gpus": gpus,
        "steps": len(rows),
        "steady_steps": len(steady),
        "samples_per_step": per_gpu_batch * gpus,
        "samples_per_s": per_gpu_batch * gpus / split["step_s"],
        **split,
        "peak_memory_gib_per_gpu": max(peaks) if peaks else None,
        "reward_first": rows[0].get("reward/mean"),
        "reward_last": rows[-1].get("reward/mean"),
    }


def scaling(paths: list[Path], per_gpu_batch: int) -> dict[str, Any]:
    runs = sorted((summarise(p, per_gpu_batch) for p in paths), key=lambda r: r["gpus"])
    base = next((r for r in runs if r["gpus"] == 1), None)
    for run in runs:
        run["efficiency"] = None if base is None else run["samples_per_s"] / (run["gpus"] * base["samples_per_s"])
    return {"per_gpu_batch": per_gpu_batch, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", type=Path)
    parser.add_argument("--per-gpu-batch", type=int, required=True)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    report = scaling(args.metrics, args.per_gpu_batch)
    text = json.dumps(report, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
