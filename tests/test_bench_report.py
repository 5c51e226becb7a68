"""bench/report.py tables bench JSON by its ``bench`` field, names each row's file and flags bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def report(folder: Path) -> list[list[str]]:
    out = subprocess.run([sys.executable, str(BENCH / "report.py"), str(folder)], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    return [line.split() for line in out.splitlines()]


def test_rows_by_bench_field_with_ratio_partial_and_unreadable(tmp_path: Path) -> None:
    export = {"bench": "export", "partial": True, "results": [
        {"impl": "ours/diffusers", "seconds": 5.0, "peak_rss_gib": 4.0},
        {"impl": "baseline/save_pretrained", "seconds": 4.0, "peak_rss_gib": 5.0},
    ]}
    rewards = {"bench": "rewards", "ocr_omp_thread_limit": "1", "throughput": {
        "jpeg_compressibility": {"images_per_s": 160.0, "batch": 16, "size": 512, "weights": "none"},
        "ocr": {"images_per_s": 29.0, "batch": 16, "size": 512, "weights": "none"},
    }}
    (tmp_path / "a-export.json").write_text(json.dumps(export))
    (tmp_path / "b-rewards.json").write_text(json.dumps(rewards))
    (tmp_path / "c-other.json").write_text(json.dumps({"bench": "something_else"}))
    (tmp_path / "d-broken.json").write_text("{")
    lines = report(tmp_path)
    text = [" ".join(line) for line in lines]
    assert any(t.startswith("unreadable JSON") and t.endswith("d-broken.json") for t in text)
    assert any(t.startswith("export: PARTIAL") and t.endswith("a-export.json") for t in text)
    export_row = next(line for line in lines if line[:2] == ["export", "ours/diffusers"])
    assert export_row[-2:] == ["0.80", "a-export.json"]  # 4.0 s baseline / 5.0 s ours
    assert "reward img/s ocr (OMP_THREAD_LIMIT=1) 29.00" in " ".join(text)
    assert any(t.startswith("reward img/s jpeg_compressibility 160.00 (B16,") for t in text)
    assert {"rollout:", "nft_step:"} <= {line[0] for line in lines if line[1:] == ["no", "result"]}
    assert not any("c-other.json" in t for t in text)
