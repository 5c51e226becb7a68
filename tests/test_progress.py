"""Progress for long steps of our commands: make-tiny says the size first and each step, data check shows a bar."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import torch

from cosmos_sana import log
from cosmos_sana.commands.make_tiny import planned_size, size_summary


def tensor_bytes(folder: Path) -> int:
    """Bytes of tensor data in a folder's safetensors files (each file less its 8-byte length and JSON header)."""
    total = 0
    for path in folder.rglob("*.safetensors"):
        with path.open("rb") as handle:
            header = struct.unpack("<Q", handle.read(8))[0]
        total += path.stat().st_size - 8 - header
    return total


def test_the_size_said_first_is_the_size_written(tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    from cosmos_sana.tools.tiny import build_pipeline

    counts, planned = planned_size("tiny", False, torch.float32)
    assert planned == 4 * sum(counts.values()) == tensor_bytes(tiny_image_pipeline_dir)
    steps: list[str] = []
    out = build_pipeline(tmp_path / "video", video=True, dtype=torch.bfloat16, progress=steps.append)
    assert planned_size("tiny", True, torch.bfloat16)[1] == tensor_bytes(out)
    assert steps == ["random-initialising the text encoder", "random-initialising the transformer",
                     "random-initialising the VAE", f"writing safetensors to {out}"]


def test_real_preset_summary_names_every_component_and_the_dtype() -> None:
    text = size_summary("sana-1600m", False, torch.bfloat16, "/models/x")
    counts, planned = planned_size("sana-1600m", False, torch.bfloat16)
    assert set(counts) == {"transformer", "vae", "text_encoder"} and counts["transformer"] > 1.5e9
    assert text.startswith(f"{sum(counts.values()) / 1e9:.2f} B parameters (transformer ")
    assert text.endswith(f"about {planned / 1e9:.1f} GB as bfloat16 in /models/x")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_in_a_terminal(monkeypatch) -> None:
    monkeypatch.setattr(log, "PROGRESS_DELAY_S", 0.0)
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert list(log.progress(range(3), desc="checking images", unit="sample")) == [0, 1, 2]
    shown = terminal.getvalue()
    assert "checking images:" in shown and "/3 [" in shown and shown.endswith("\r")  # drawn, then cleared
    captured = io.StringIO()  # a pipe or file: no bar at all
    monkeypatch.setattr("sys.stderr", captured)
    assert list(log.progress(range(3), desc="checking images")) == [0, 1, 2]
    assert captured.getvalue() == ""
