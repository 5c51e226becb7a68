"""Per-step metrics of launches (``logs/metrics.jsonl`` below a run folder), compared step by step.

    launch_metrics.py reference RUN [--after K] --out FILE     # RUN's metrics as a reference file
    launch_metrics.py compare RUN REFERENCE [--json-out FILE]  # RUN against a reference file
    launch_metrics.py compare RUN OTHER_RUN --after K [...]    # RUN against another run's steps after K

A reference holds ``{"rows": {step: {metric: value}}}`` with every logged number except clocks and
memory, which differ between any two runs (``wall_time``, ``train/iteration_time``, ``time/*``,
``memory/*``). The comparison lists the reference's steps the run did not log and the metrics it
did not log at a step it ran; either makes the runs not identical, as does any difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def read_rows(folder: Path, problems: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """The last row logged per step in every ``metrics.jsonl`` below ``folder`` (a resumed run logs
    the steps after its checkpoint again); unreadable lines go to ``problems`` (else raise)."""
    rows: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.rglob("metrics.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                if problems is None:
                    raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
                problems.append(f"{path}:{number}: not JSON ({exc.msg})")
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows[row["step"]] = row
    return dict(sorted(rows.items()))


def compared(key: str) -> bool:
    """Whether two runs of the same settings must log the same value for ``key``."""
    return not (key in ("step", "wall_time", "train/iteration_time") or key.startswith(("time/", "memory/")))


def reference_rows(rows: dict[int, dict[str, Any]], after: int = 0) -> dict[str, dict[str, float]]:
    """The compared numbers of ``rows``' steps after ``after``, keyed as in a reference file."""
    return {
        str(step): {k: v for k, v in row.items() if compared(k) and isinstance(v, (int, float))}
        for step, row in rows.items()
        if step > after
    }


def compare_reference(
    rows: dict[int, dict[str, Any]], reference: dict[str, dict[str, float]], *, detail: bool = False
) -> dict[str, Any]:
    """``rows`` (one run's) against ``reference``'s steps and metrics; ``detail`` adds every difference."""
    steps = sorted((s for s in reference if int(s) in rows), key=int)
    diff = {s: {k: abs(rows[int(s)][k] - v) for k, v in reference[s].items() if k in rows[int(s)]} for s in steps}
    missing = {s: sorted(set(reference[s]) - set(rows[int(s)])) for s in steps if set(reference[s]) - set(rows[int(s)])}
    steps_missing = sorted(set(reference) - set(steps), key=int)
    result = {
        "steps_compared": steps,
        "steps_missing": steps_missing,
        "metrics_missing": missing,
        "max_abs_diff_per_step": {s: max(d.values(), default=None) for s, d in diff.items()},
        "identical": bool(steps) and not steps_missing and not missing
        and all(v == 0 for d in diff.values() for v in d.values()),
    }
    return {**result, "metric_abs_diff": diff} if detail else result


def _reference_of(path: Path, after: int) -> dict[str, dict[str, float]]:
    if path.is_dir():
        return reference_rows(read_rows(path), after)
    try:
        return json.loads(path.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"reference {path}: not a run folder or a JSON object with 'rows' ({exc})") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser("reference", help="write a run's compared metrics as a reference file")
    ref.add_argument("run", type=Path)
    ref.add_argument("--after", type=int, default=0, help="only steps after this one")
    ref.add_argument("--out", type=Path, required=True)
    cmp_ = sub.add_parser("compare", help="compare a run with a reference file or another run")
    cmp_.add_argument("run", type=Path)
    cmp_.add_argument("reference", type=Path, help="a reference file, or another run's folder")
    cmp_.add_argument("--after", type=int, default=0, help="with a run folder as reference: only steps after this one")
    cmp_.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "reference":
            rows = reference_rows(read_rows(args.run), args.after)
            args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n", encoding="utf-8")
            print(f"{args.out}: {len(rows)} steps of {args.run}")
            return 0
        rows = read_rows(args.run)
        result = compare_reference(rows, _reference_of(args.reference, args.after), detail=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["reward_mean"] = {s: rows[int(s)].get("reward/mean") for s in result["steps_compared"]}
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "metric_abs_diff"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
