"""scripts/device/scale_nft_replicate.sh with DRY_RUN=1 on CPU: each row's launch settings validate and
select the placement the row names."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device" / "scale_nft_replicate.sh"


def run(tmp_path: Path, rows: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY_RUN": "1", "ROWS": rows, "WORK": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_rows_validate_and_select_their_placement(tmp_path: Path) -> None:
    result = run(tmp_path, "replicate fsdp-sync-every")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == ["fsdp-n1", "replicate-n2", "fsdp-sync-every-n2"]

    def resolved(tag: str) -> dict:
        return tomllib.loads(next((tmp_path / tag).rglob("*.resolved.toml")).read_text())

    one, replicate = resolved("fsdp-n1"), resolved("replicate-n2")
    assert one["policy"]["parallelism"]["dp_shard_size"] == 1
    assert one["custom"]["model"]["lora_data_parallel"] == "fsdp"
    assert replicate["policy"]["parallelism"]["dp_shard_size"] == 2
    assert replicate["custom"]["model"]["lora_data_parallel"] == "replicate"
    assert replicate["train"]["train_batch_per_replica"] == 2 * one["train"]["train_batch_per_replica"] == 32
    sync_every = resolved("fsdp-sync-every-n2")["custom"]["model"]
    assert sync_every["lora_data_parallel"] == "fsdp" and sync_every["fsdp_gradient_sync"] == "every_backward"
    assert "fsdp_gradient_sync" not in one["custom"]["model"]  # the default rows keep the default ("auto")


def test_unknown_row_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = run(tmp_path, "replicate ddp")
    assert result.returncode == 2
    assert "unknown row 'ddp' (rows: fsdp, fsdp-never, fsdp-sync-every, replicate)" in result.stderr
    assert not list(tmp_path.glob("*-n*"))
