"""The scaling table: steady-state medians, samples/s and efficiency from hand-made run logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "scale_report.py"


def run_log(path: Path, step_times: list[float], peak: float) -> Path:
    rows = []
    for i, step in enumerate(step_times, start=1):
        rows.append({"step": i, "reward/mean": -0.3 + 0.01 * i, "memory/peak_gib": peak, "time/step_s": step,
                     "time/rollout_s": step / 4, "time/reward_wait_s": 0.1, "time/train_s": step / 2,
                     "time/other_s": step / 4 - 0.1})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_steady_state_and_efficiency(tmp_path):
    one = run_log(tmp_path / "metrics-n1.jsonl", [30.0, 8.0, 8.0, 10.0, 25.0], peak=40.0)  # median 8
    two = run_log(tmp_path / "metrics-n2.jsonl", [31.0, 10.0, 9.0, 10.0, 26.0], peak=41.5)  # median 10
    out = subprocess.run([sys.executable, str(SCRIPT), str(two), str(one), "--per-gpu-batch", "16",
                          "--json-out", str(tmp_path / "s.json")], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report == json.loads((tmp_path / "s.json").read_text())
    n1, n2 = report["runs"]
    assert (n1["gpus"], n2["gpus"]) == (1, 2) and n1["steady_steps"] == 3
    assert n1["step_s"] == 8.0 and n1["train_s"] == 4.0 and n1["samples_per_s"] == 2.0  # 16 / 8
    assert n2["samples_per_s"] == 3.2 and n2["samples_per_step"] == 32  # 32 / 10
    assert n2["efficiency"] == pytest.approx(0.8)  # 3.2 / (2 × 2.0)
    assert n2["peak_memory_gib_per_gpu"] == 41.5 and n1["reward_first"] == pytest.approx(-0.29)


def test_bad_inputs_are_named(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    from scale_report import summarise

    with pytest.raises(ValueError, match=r"metrics\.jsonl: name it \.\.\.-n<GPUS>\.jsonl"):
        summarise(run_log(tmp_path / "metrics.jsonl", [1.0, 1.0, 1.0], 1.0), 16)
    with pytest.raises(ValueError, match="2 steps logged; need at least 3"):
        summarise(run_log(tmp_path / "short-n1.jsonl", [1.0, 1.0], 1.0), 16)
    old = tmp_path / "old-n1.jsonl"
    old.write_text("".join(json.dumps({"step": i, "reward/mean": 0.0}) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match="rows without"):
        summarise(old, 16)
