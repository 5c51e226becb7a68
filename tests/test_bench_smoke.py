"""The rollout bench runs end to end on the tiny model (CPU) and prints its JSON; no timing asserts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
def test_rollout_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "rollout.json"
    subprocess.run(
        [sys.executable, str(BENCH / "bench_rollout.py"), "--preset", "tiny", "--device", "cpu", "--steps", "2",
         "--sizes", "64", "--threads", "1", "--repeats", "1", "--json-out", str(out)],
        check=True, timeout=900, capture_output=True,
    )
    result = json.loads(out.read_text())
    assert {"bench", "env", "config", "flops_per_image_forward", "results", "summary"} <= result.keys()
    impls = {row["impl"] for row in result["results"]}
    assert {"diffusers", "upstream", "ours/eager", "ours/bf16_attn", "ours/text_kv"} <= impls
    for row in result["results"]:
        assert row["images_per_s"] > 0 and row["seconds"] > 0
    for entry in result["summary"]:
        assert {"ours_images_per_s", "vs_diffusers", "vs_upstream"} <= entry.keys()
