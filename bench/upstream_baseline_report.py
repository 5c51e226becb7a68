"""Seconds per step, samples/s and time to first step of two RL launches from their controller logs.

    python bench/upstream_baseline_report.py --samples-per-step 16 --steps 8 \\
        --run upstream:START:STATUS:CONTROLLER_LOG[:GPU_MEMORY_CSV] \\
        --run ours:START:STATUS:CONTROLLER_LOG[:GPU_MEMORY_CSV] \\
        [--metrics ours:metrics.jsonl] [--settings JSON] [--json-out FILE]

Both launches (cosmos-rl's own SANA NFT path and ours, ``scripts/device/upstream_baseline.sh``)
run cosmos-rl's controller, which logs one ``[Controller] Train report data`` line per finished
step, stamped by cosmos-rl's logger (``YYYY-MM-DD HH:MM:SS,mmm``, the machine's local time). The
same line on both sides is the clock: step k took ``end(k) - end(k-1)``; seconds per step is the
median over every step after the first (the first carries compilation and warm-up and is
reported as time to first step: from START, the launch's epoch second, to ``end(1)``).
``train/iteration_time`` of each line is the trainer's own training time of the step; the rest
(``not_train_s_median``) is rollout, reward and the controller round trip. Should a controller log
hold no report lines, the side's ``--metrics`` run log's ``wall_time`` rows are the clock instead
(``clock`` says which).
``--metrics`` adds the medians of our run log's ``time/*`` split over the same steps; a GPU memory
CSV (``nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1``) gives the peak MiB
the GPU held during that launch.
The ratios are ours over upstream: samples/s (above 1: ours is faster), seconds per step and
time to first step (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
from pathlib import Path
from typing import Any

REPORT_LINE = re.compile(
    r"(?P<stamp>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[,.](?P<ms>\d{1,6}))?.*\[Controller\] Train report data"
)
ITERATION_TIME = re.compile(r"(?<![\w/])train/iteration_time: (?P<value>[-+0-9.eE]+|nan)")
TIME_PARTS = ("step", "rollout", "reward_wait", "train", "other")
RATIO_KEYS = ("samples_per_s", "step_s_median", "time_to_first_step_s", "train_s_median", "not_train_s_median")


def step_ends(log: Path) -> list[tuple[float, float | None]]:
    """``(epoch seconds, train/iteration_time or None)`` of every step report line in a controller log."""
    ends = []
    for line in log.read_text(errors="replace").splitlines():
        match = REPORT_LINE.search(line)
        if match is None:
            continue
        stamp = datetime.datetime.strptime(match["stamp"].replace("T", " "), "%Y-%m-%d %H:%M:%S")
        fraction = float(f"0.{match['ms']}") if match["ms"] else 0.0
        timed = ITERATION_TIME.search(line)
        ends.append((stamp.timestamp() + fraction, float(timed["value"]) if timed else None))
    return ends


def summarise(
    ends: list[tuple[float, float | None]], start: float, samples_per_step: int, steps_requested: int
) -> dict[str, Any]:
    """Timing of one launch from its step ends (see the module docstring)."""
    times = [t for t, _ in ends]
    if any(later < earlier for earlier, later in zip(times, times[1:])):
        raise ValueError(f"step report times go backwards: {times}")
    durations = [later - earlier for earlier, later in zip(times, times[1:])]
    trained = [seconds for _, seconds in ends[1:] if seconds is not None]
    # per step: what is not training (rollout, reward wait, the controller round trip, waits)
    rest = [d - seconds for d, (_, seconds) in zip(durations, ends[1:]) if seconds is not None]
    step_s = statistics.median(durations) if durations else None
    return {
        "steps_logged": len(ends),
        "complete": len(ends) >= steps_requested,
        "time_to_first_step_s": times[0] - start if times else None,
        "step_s": durations,
        "step_s_median": step_s,
        "samples_per_s": samples_per_step / step_s if step_s else None,
        "train_s_median": statistics.median(trained) if trained else None,
        "not_train_s_median": statistics.median(rest) if rest else None,
    }


def run_log_ends(path: Path) -> list[tuple[float, float | None]]:
    """``(wall_time, train/iteration_time)`` of every row of our run log (the clock when a controller
    log holds no report lines)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(row["wall_time"], row.get("train/iteration_time")) for row in rows if "wall_time" in row]


def metrics_split(path: Path) -> dict[str, Any]:
    """Medians of our run log's ``time/*`` over every step after the first, and its peak memory."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    split: dict[str, Any] = {}
    for part in TIME_PARTS:
        values = [row[f"time/{part}_s"] for row in rows[1:] if f"time/{part}_s" in row]
        split[f"{part}_s_median"] = statistics.median(values) if values else None
    peaks = [row["memory/peak_gib"] for row in rows if "memory/peak_gib" in row]
    split["peak_memory_gib"] = max(peaks) if peaks else None
    split["steps"] = len(rows)
    return split


def gpu_memory_peak_mib(path: Path) -> float | None:
    """The largest ``memory.used`` sample of an ``nvidia-smi ... --format=csv,noheader,nounits`` log."""
    values = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            values.append(float(line.split(",")[0]))
        except ValueError:
            continue  # a line nvidia-smi printed about itself
    return max(values) if values else None


def ratio(ours: float | None, upstream: float | None) -> float | None:
    return ours / upstream if ours is not None and upstream else None


def report(
    runs: dict[str, dict[str, Any]], samples_per_step: int, steps: int, metrics: dict[str, Path], settings: dict
) -> dict[str, Any]:
    sides: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        log = Path(run["log"])
        side: dict[str, Any] = {"exit_status": run["status"], "controller_log": str(log)}
        ends = step_ends(log) if log.is_file() else []
        side["clock"] = "controller log"
        if not ends and name in metrics and metrics[name].is_file():
            ends, side["clock"] = run_log_ends(metrics[name]), "run log wall_time"
        if ends:
            side.update(summarise(ends, run["start"], samples_per_step, steps))
        else:
            reason = "no step report lines in" if log.is_file() else "no controller log at"
            side.update({"steps_logged": 0, "complete": False, "error": f"{reason} {log}"})
        if run.get("gpu_memory"):
            memory = Path(run["gpu_memory"])
            side["gpu_memory_peak_mib"] = gpu_memory_peak_mib(memory) if memory.is_file() else None
        if name in metrics and metrics[name].is_file():
            side["run_log_split"] = metrics_split(metrics[name])
        sides[name] = side
    result: dict[str, Any] = {
        "bench": "upstream_baseline",
        "samples_per_step": samples_per_step,
        "steps_requested": steps,
        "settings": settings,
        **sides,
    }
    if {"ours", "upstream"} <= sides.keys():
        ours, upstream = sides["ours"], sides["upstream"]
        result["ratio_ours_over_upstream"] = {
            key: ratio(ours.get(key), upstream.get(key))
            for key in RATIO_KEYS
        }
    return result


def parse_run(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:START:STATUS:CONTROLLER_LOG[:GPU_MEMORY_CSV]`` (paths without ``:``)."""
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(f"--run {text!r}: expected NAME:START:STATUS:CONTROLLER_LOG[:GPU_MEMORY_CSV]")
    name, start, status, log, *memory = parts
    try:
        run = {"start": float(start), "status": int(status), "log": log, "gpu_memory": memory[0] if memory else None}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--run {text!r}: START must be epoch seconds and STATUS an integer") from None
    return name, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", type=parse_run, required=True)
    parser.add_argument("--metrics", action="append", default=[], metavar="NAME:METRICS_JSONL")
    parser.add_argument("--samples-per-step", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="training steps each launch was asked for")
    parser.add_argument("--settings", type=json.loads, default={}, help="a JSON object copied into the report")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    metrics = {}
    for item in args.metrics:
        name, sep, path = item.partition(":")
        if not sep:
            parser.error(f"--metrics {item!r}: expected NAME:METRICS_JSONL")
        metrics[name] = Path(path)
    result = report(dict(args.run), args.samples_per_step, args.steps, metrics, args.settings)
    text = json.dumps(result, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
