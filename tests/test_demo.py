"""The README's demo command, on the CPU path (the GPU path is exercised on the device)."""

from __future__ import annotations

import json

import pytest

from cosmos_sana.cli import main


@pytest.mark.slow
def test_demo_trains_checkpoints_and_exports_a_loadable_lora(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--mode", "local", "--steps", "2", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["mode"] == "local" and summary["steps"] == 2
    export = out / "export-lora"
    assert (export / "pytorch_lora_weights.safetensors").is_file()
    assert (export / "export_manifest.json").is_file()
    assert list(out.glob("run/*/checkpoints/iter_000000002/COMPLETE"))


def test_demo_refuses_a_missing_recipe(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.toml"):
        main(["demo", "--recipe", "nope.toml", "--out", str(tmp_path), "--mode", "local"])


def test_demo_refuses_a_bad_fast_startup_flag_with_its_name(tmp_path):
    """The recipe's validation refuses the flag's value; demo reports it as `run` does, not as a traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_")}
    env["COSMOS_SANA_FAST_STARTUP"] = "yes"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cosmos-sana"), "demo", "--mode", "local", "--steps", "1",
         "--out", str(tmp_path / "demo")],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: COSMOS_SANA_FAST_STARTUP='yes': use 0")
    assert not (tmp_path / "demo" / "run").exists()
