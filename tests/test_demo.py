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
