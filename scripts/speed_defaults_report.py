#!/usr/bin/env python3
"""The rollout speed features inside full launches: one launch per configuration, compared with the
launch without them (``scripts/device/speed_defaults.sh`` runs the launches).

    speed_defaults_report.py overrides NAME --graph-batch N   # the launcher overrides of a configuration
    speed_defaults_report.py report --run NAME DIR [--run ...] [--baseline off] [--reference JSON] [--json-out F]

A run folder ``DIR`` holds one launch: its ``metrics.jsonl`` (anywhere below), its logs (``*.log``),
``rollout-dump/`` (the first step's rollouts, written with ``COSMOS_SANA_ROLLOUT_DUMP``) and, from the
device script, ``exit_status`` and ``wall_s``. Per configuration the report gives the first step's
time (it includes compilation and CUDA-graph capture), the median step / rollout / train time of the
later steps, ``reward/mean`` per step, the peak memory, and against the baseline launch the largest
absolute and the relative (Frobenius) difference of the first step's latents and images (same seeds
required), the reward differences per step and the speed-up of the medians. Launches that ran side
by side on one GPU slow each other: ``concurrent_launches`` is how many other launches were stepping,
on average, during this launch's timed steps. With ``--reference`` (``{"rows": {step: {metric:
value}}}``, e.g. ``bench/results/2026-12-01-h200-nft-600m-256-reference-metrics.json``) the
baseline's metrics are also compared with an earlier launch of the same settings.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # launch_metrics, beside this file, also when imported
from launch_metrics import compare_reference, read_rows  # noqa: E402

#: ``[custom.rollout.speed]`` per configuration, as changes from :data:`FEATURES_OFF`;
#: ``cuda_graph_max_batch`` is filled in with the rollout's forward batch (``rollout.n_generation_mini_batch``
#: without CFG). ``recipe`` is what toml/sana-image-nft.toml ships.
CONFIGS: dict[str, dict[str, Any]] = {
    "off": {},
    "bf16": {"linear_attention": "bf16"},
    "text_kv": {"cache_text_kv": True},
    "compile": {"compile_blocks": True},
    "graphs": {"cuda_graph_max_batch": None},
    "recipe": {"linear_attention": "bf16", "cache_text_kv": True, "compile_blocks": True},
    "all": {"linear_attention": "bf16", "cache_text_kv": True, "compile_blocks": True, "cuda_graph_max_batch": None},
}
#: every feature a configuration can switch, off: each launch sets all of them, so that what a recipe
#: ships in ``[custom.rollout.speed]`` does not leak into a configuration (``off`` really is off)
FEATURES_OFF: dict[str, Any] = {
    "linear_attention": "fp32", "cache_text_kv": False, "compile_blocks": False, "cuda_graph_max_batch": 0,
    "vae_channels_last": False, "compile_vae": False,
}
#: relative (Frobenius) error allowed by default between a configuration's first-step latents and the
#: baseline's: the bound documented for the bf16 linear attention against fp32 maths (``BF16_TOLERANCE`` in
#: tests/test_fast_denoise.py), applied to a whole rollout. A sampler configuration amplifies any
#: per-forward change by its own factor (bench/bench_sampler_sensitivity.py), so a recipe's bar is better
#: set with ``--relative-tolerance`` to how far the stock bf16 path lies from fp32 maths under that
#: recipe's sampler (scripts/device/speed_defaults.sh does, per RECIPE).
RELATIVE_TOLERANCE = 5e-3
DUMP_FOLDER = "rollout-dump"
TENSORS = ("latents", "media")
#: log lines that tell whether a feature ran as meant (counted per launch)
LOG_MARKERS = {
    "cuda_graphs_captured": re.compile(r"captured a CUDA graph"),
    "recompile_limit_hit": re.compile(r"recompile_limit|cache_size_limit"),
    "tracebacks": re.compile(r"^Traceback \(most recent call last\)", re.MULTILINE),
}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def overrides(name: str, graph_batch: int) -> list[str]:
    """``key=value`` launcher overrides of configuration ``name``."""
    if name not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; one of {', '.join(CONFIGS)}")
    if graph_batch < 1:
        raise ValueError(f"--graph-batch must be at least 1, not {graph_batch}")
    settings = {**FEATURES_OFF, **CONFIGS[name]}
    return [
        f"custom.rollout.speed.{key}={toml_value(graph_batch if value is None else value)}"
        for key, value in settings.items()
    ]


# ---------------------------------------------------------------------------- one launch


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
    return statistics.median(values) if values else None


def _read_number(path: Path, problems: list[str]) -> float | None:
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8").strip()
    try:
        return float(text)
    except ValueError:
        problems.append(f"{path}: not a number: {text[:40]!r}")
        return None


def log_markers(folder: Path) -> dict[str, int]:
    counts = dict.fromkeys(LOG_MARKERS, 0)
    for path in sorted(folder.rglob("*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for name, pattern in LOG_MARKERS.items():
            counts[name] += len(pattern.findall(text))
    return counts


def step_spans(rows: dict[int, dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """``(start, end)`` wall-clock seconds of each step that logged its duration."""
    return {
        step: (row["wall_time"] - row["time/step_s"], row["wall_time"])
        for step, row in rows.items()
        if isinstance(row.get("wall_time"), (int, float)) and isinstance(row.get("time/step_s"), (int, float))
    }


def summarise_run(name: str, folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise FileNotFoundError(f"run {name!r}: folder {folder} does not exist")
    problems: list[str] = []
    rows = read_rows(folder, problems)
    first = rows.get(1, {})
    later = [row for step, row in rows.items() if step > 1]
    median_step = _median(later, "time/step_s")
    exit_status = _read_number(folder / "exit_status", problems)
    peaks = [row["memory/peak_gib"] for row in rows.values() if isinstance(row.get("memory/peak_gib"), (int, float))]
    return {
        "config": CONFIGS.get(name),
        "exit_status": None if exit_status is None else int(exit_status),
        "wall_s": _read_number(folder / "wall_s", problems),
        "steps_logged": len(rows),
        "first_step_s": first.get("time/step_s"),
        "first_rollout_s": first.get("time/rollout_s"),
        "first_train_s": first.get("time/train_s"),
        "median_step_s": median_step,
        "median_rollout_s": _median(later, "time/rollout_s"),
        "median_train_s": _median(later, "time/train_s"),
        "first_step_extra_s": None if median_step is None or "time/step_s" not in first
        else first["time/step_s"] - median_step,
        "timed_steps": len(later),
        "reward_mean": {str(step): row["reward/mean"] for step, row in rows.items() if "reward/mean" in row},
        "peak_memory_gib": max(peaks) if peaks else None,
        "log_markers": log_markers(folder),
        "problems": problems,
    }


def concurrency(spans: dict[str, dict[int, tuple[float, float]]]) -> dict[str, float | None]:
    """Per run: how many other runs were stepping (between their first step's start and last step's end),
    averaged over this run's steps after the first."""
    busy = {name: (min(s for s, _ in steps.values()), max(e for _, e in steps.values()))
            for name, steps in spans.items() if steps}
    result: dict[str, float | None] = {}
    for name, steps in spans.items():
        timed = [span for step, span in steps.items() if step > 1]
        if not timed:
            result[name] = None
            continue
        overlaps = [sum(1 for other, (s, e) in busy.items() if other != name and s < end and e > start)
                     for start, end in timed]
        result[name] = sum(overlaps) / len(overlaps)
    return result


# ---------------------------------------------------------------------------- against the baseline


def _load_dump(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
    missing = [key for key in (*TENSORS, "seeds") if key not in tensors]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} (written by COSMOS_SANA_ROLLOUT_DUMP?)")
    return tensors


def compare_dumps(run: Path, baseline: Path, tolerance: float = RELATIVE_TOLERANCE) -> dict[str, Any]:
    """First-step rollouts of ``run`` against ``baseline``'s, file by file (same names, same seeds);
    within tolerance when the latents' relative error is at most ``tolerance``."""
    import torch

    files = sorted(p.name for p in (baseline / DUMP_FOLDER).glob("*.safetensors"))
    present = [f for f in files if (run / DUMP_FOLDER / f).is_file()]
    report: dict[str, Any] = {"files_compared": len(present), "files_missing": sorted(set(files) - set(present))}
    if not present:
        return {**report, "within_tolerance": None, "bit_identical": None}
    sums = {key: [0.0, 0.0, 0.0] for key in TENSORS}  # squared difference, squared reference, largest difference
    identical = True
    for name in present:
        got, want = _load_dump(run / DUMP_FOLDER / name), _load_dump(baseline / DUMP_FOLDER / name)
        if not torch.equal(got["seeds"], want["seeds"]):
            raise ValueError(f"{run / DUMP_FOLDER / name}: seeds differ from {baseline / DUMP_FOLDER / name}; "
                             "the launches did not sample the same noise (same train.seed and batch settings?)")
        for key in TENSORS:
            a, b = got[key].double(), want[key].double()
            if a.shape != b.shape:
                raise ValueError(f"{run / DUMP_FOLDER / name}: {key} has shape {tuple(a.shape)}, "
                                 f"the baseline's {tuple(b.shape)}")
            identical = identical and torch.equal(got[key], want[key])
            diff = a - b
            sums[key][0] += float(diff.square().sum())
            sums[key][1] += float(b.square().sum())
            sums[key][2] = max(sums[key][2], float(diff.abs().max()) if diff.numel() else 0.0)
    for key, (diff2, ref2, largest) in sums.items():
        report[key] = {"max_abs_diff": largest,
                       "relative_error": math.sqrt(diff2 / ref2) if ref2 > 0 else (0.0 if diff2 == 0 else math.inf)}
    report["within_tolerance"] = report["latents"]["relative_error"] <= tolerance
    report["bit_identical"] = identical
    return report


def compare_rewards(run: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    return {step: abs(value - baseline["reward_mean"][step])
            for step, value in run["reward_mean"].items() if step in baseline["reward_mean"]}


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def report(runs: list[tuple[str, Path]], baseline: str, reference: Path | None,
           tolerance: float = RELATIVE_TOLERANCE) -> dict[str, Any]:
    names = [name for name, _ in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"a configuration is given twice: {names}")
    folders = dict(runs)
    if baseline not in folders:
        raise ValueError(f"baseline {baseline!r} is not among the runs ({', '.join(names)})")
    summaries = {name: summarise_run(name, folder) for name, folder in runs}
    spans = {name: step_spans(read_rows(folder, [])) for name, folder in runs}
    for name, value in concurrency(spans).items():
        summaries[name]["concurrent_launches"] = value
    base = summaries[baseline]
    for name, summary in summaries.items():
        if name == baseline:
            continue
        try:
            rollout = compare_dumps(folders[name], folders[baseline], tolerance)
        except ValueError as exc:  # the other numbers of this launch still count
            rollout = {"error": str(exc), "within_tolerance": None, "bit_identical": None}
        summary["vs_baseline"] = {
            "rollout": rollout,
            "reward_mean_abs_diff": compare_rewards(summary, base),
            "median_step_speedup": _ratio(base["median_step_s"], summary["median_step_s"]),
            "median_rollout_speedup": _ratio(base["median_rollout_s"], summary["median_rollout_s"]),
            "median_train_speedup": _ratio(base["median_train_s"], summary["median_train_s"]),
        }
    result: dict[str, Any] = {"bench": "speed_defaults", "baseline": baseline,
                              "relative_tolerance": tolerance, "runs": summaries}
    if reference is not None:
        try:
            rows = json.loads(reference.read_text(encoding="utf-8"))["rows"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"reference {reference}: not a JSON object with 'rows' ({exc})") from exc
        result["baseline_vs_reference"] = {"reference": str(reference),
                                           **compare_reference(read_rows(folders[baseline], []), rows)}
    return result


def one_line(name: str, run: dict[str, Any]) -> str:
    def fmt(value: Any, spec: str = ".3g") -> str:
        return "-" if value is None else format(value, spec)

    rollout = run.get("vs_baseline", {}).get("rollout", {})
    latents = rollout.get("latents", {})
    return (f"{name:8s} exit {fmt(run['exit_status'], 'd')} steps {run['steps_logged']} | first step "
            f"{fmt(run['first_step_s'])} s, then median {fmt(run['median_step_s'])} s (rollout "
            f"{fmt(run['median_rollout_s'])}, train {fmt(run['median_train_s'])}) beside "
            f"{fmt(run.get('concurrent_launches'), '.1f')} | latents vs baseline: max {fmt(latents.get('max_abs_diff'))}"
            f" rel {fmt(latents.get('relative_error'))} ok {rollout.get('within_tolerance', '-')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    over = sub.add_parser("overrides", help="print a configuration's launcher overrides, one a line")
    over.add_argument("name")
    over.add_argument("--graph-batch", type=int, required=True, help="cuda_graph_max_batch where a configuration uses graphs")
    rep = sub.add_parser("report", help="compare the launches")
    rep.add_argument("--run", nargs=2, action="append", metavar=("NAME", "DIR"), required=True)
    rep.add_argument("--baseline", default="off")
    rep.add_argument("--reference", type=Path)
    rep.add_argument("--json-out", type=Path)
    rep.add_argument("--relative-tolerance", type=float, default=RELATIVE_TOLERANCE,
                     help="largest relative error of the first-step latents vs the baseline's that passes")
    args = parser.parse_args(argv)
    try:
        if args.command == "overrides":
            for line in overrides(args.name, args.graph_batch):
                print(line)
            return 0
        if args.command == "report" and not 0 < args.relative_tolerance < 1:
            raise ValueError(f"--relative-tolerance must be between 0 and 1, not {args.relative_tolerance}")
        result = report([(name, Path(folder)) for name, folder in args.run], args.baseline, args.reference,
                        args.relative_tolerance)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for name, run in result["runs"].items():
        print(one_line(name, run))
    if "baseline_vs_reference" in result:
        ref = result["baseline_vs_reference"]
        print(f"baseline vs reference: steps {ref['steps_compared']} identical {ref['identical']} "
              f"max abs diff {ref['max_abs_diff_per_step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
