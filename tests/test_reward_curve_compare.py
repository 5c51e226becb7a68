"""scripts/device/resume_exact.sh RUNS=a: one launch's logged metrics compared step by step with a
reference run's (scripts/launch_metrics.py compare, which the script calls, run on hand-made metrics)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device" / "resume_exact.sh"
REFERENCE = {"1": {"reward/mean": 0.5, "train/loss": 2.0}, "2": {"reward/mean": 0.6, "train/loss": 1.5}}


LAUNCH_METRICS = SCRIPT.parents[1] / "launch_metrics.py"


def test_runs_a_compares_through_launch_metrics():
    text = SCRIPT.read_text(encoding="utf-8")
    assert re.search(r'RUNS:-a b\} == a .*?launch_metrics\.py compare "\$work/a"', text, re.S), (
        f"{SCRIPT}: the RUNS=a branch no longer compares with scripts/launch_metrics.py")


def compare(tmp_path: Path, logged: list[dict]) -> dict:
    run = tmp_path / "a" / "logs"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in logged), encoding="utf-8")
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps({"rows": REFERENCE}), encoding="utf-8")
    dest = tmp_path / "reward_curve.json"
    subprocess.run([sys.executable, str(LAUNCH_METRICS), "compare", str(tmp_path / "a"), str(reference),
                    "--json-out", str(dest)], text=True, check=True, capture_output=True)
    return json.loads(dest.read_text(encoding="utf-8"))


def rows(**changes: float) -> list[dict]:
    return [{"step": int(s), "time/step": 9.0, **metrics, **changes} for s, metrics in REFERENCE.items()]


def test_the_same_metrics_are_identical(tmp_path):
    result = compare(tmp_path, rows())
    assert result["identical"] is True and result["steps_compared"] == ["1", "2"]
    assert result["max_abs_diff_per_step"] == {"1": 0.0, "2": 0.0} and result["metrics_missing"] == {}


@pytest.mark.parametrize(
    ("logged", "what"),
    [
        (lambda: rows()[:1], "steps_missing"),
        (lambda: [{k: v for k, v in r.items() if k != "train/loss"} for r in rows()], "metrics_missing"),
        (lambda: rows(**{"train/loss": 1.5}), "max_abs_diff_per_step"),
    ],
    ids=["a step missing", "a metric missing", "a metric differs"],
)
def test_a_difference_is_not_identical_and_is_named(tmp_path, logged, what):
    result = compare(tmp_path, logged())
    assert result["identical"] is False
    assert {"steps_missing": ["2"], "metrics_missing": {"1": ["train/loss"], "2": ["train/loss"]},
            "max_abs_diff_per_step": {"1": 0.5, "2": 0.0}}[what] == result[what]
