"""The OCR reward's Tesseract worker pool: reward values with the default settings, workers that stay
loaded across calls and stop on close, a worker killed mid-read, and bad input named precisely."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cosmos_sana.config import RewardRef
from cosmos_sana.plugin_manager import installed_plugins
from cosmos_sana.rewards.scorers import MediaError, ScorerSet
from cosmos_sana_plugins.rewards import ocr, tesseract_pool
from cosmos_sana_plugins.rewards.ocr import OcrOptions, OcrScorer, TesseractBackend

pytestmark = pytest.mark.skipif(tesseract_pool.find_library() is None, reason="libtesseract is not installed")
PROMPT = 'a neon sign that reads "OPEN LATE"'


def pil(tensor: torch.Tensor) -> Image.Image:
    return ocr.to_pil(tensor.unsqueeze(0))[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_default_settings_score_exact_text_one_word_off_and_blank_by_hand(render_text):
    """'OPEN GATE' vs target 'OPEN LATE': normalised 'opengate' → 'openlate' is one substitution
    in 8 letters → 1 − 1/8. A blank image reads nothing → distance capped at 8 → 0."""
    scorer = ScorerSet.build([RewardRef(name="ocr")], installed_plugins(), device="cpu")
    media = torch.stack([render_text("OPEN LATE"), render_text("OPEN GATE"), render_text("")])
    assert scorer.score(media, [PROMPT] * 3).total == pytest.approx([1.0, 1 - 1 / 8, 0.0])


def test_library_workers_read_what_the_tesseract_program_reads(render_text):
    """The library path (the default) gives the program's text byte for byte at the same settings."""
    images = [pil(render_text(t)) for t in ("OPEN LATE", "Ship It", "")] + [
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8))
    ]
    library, program = TesseractBackend(threads=2), TesseractBackend(threads=2, engine="program")
    try:
        assert library.settings.library is not None and program.settings.library is None
        texts = library(images)
        assert texts == program(images)
        assert texts[0].strip() == "OPEN LATE" and texts[2] == ""
    finally:
        library.close()
        program.close()


def test_workers_stay_across_calls_and_stop_on_close(render_text):
    backend = TesseractBackend(threads=2)
    images = [pil(render_text(t)) for t in ("OPEN LATE", "Ship It", "Night Train", "")]
    assert backend.pool.pids() == []  # nothing starts before the first read
    first = backend(images)
    pids = backend.pool.pids()
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert backend(images) == first
    assert backend.pool.pids() == pids  # the same processes served the second call
    backend.close()
    assert backend.pool.pids() == [] and not any(alive(p) for p in pids)
    assert backend(images[:1]) == first[:1]  # a later call starts fresh workers
    assert set(backend.pool.pids()).isdisjoint(pids)
    backend.close()


def test_a_worker_killed_mid_read_names_the_image_and_is_replaced(render_text):
    backend = TesseractBackend(threads=2)
    noise = np.random.default_rng(1).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    images = [Image.fromarray(noise)] * 24  # long enough to kill a worker while it reads
    errors: list[BaseException] = []

    def read() -> None:
        try:
            backend(images)
        except RuntimeError as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    while len(backend.pool.pids()) < 2:
        time.sleep(0.01)
    victim = backend.pool.pids()[0]
    os.kill(victim, signal.SIGKILL)
    reader.join(timeout=120)
    assert len(errors) == 1
    assert f"the Tesseract worker (pid {victim}) died reading image" in str(errors[0])
    assert backend([pil(render_text("OPEN LATE"))])[0].strip() == "OPEN LATE"
    assert victim not in backend.pool.pids()
    backend.close()


def test_workers_run_tesseract_single_threaded_unless_the_environment_says(monkeypatch, render_text):
    """The limit is in each worker's environment, never in this process's."""

    def worker_limit() -> str | None:
        backend = TesseractBackend(threads=1)
        backend([pil(render_text("a"))])
        environ = open(f"/proc/{backend.pool.pids()[0]}/environ", "rb").read().split(b"\0")
        backend.close()
        found = [v for v in environ if v.startswith(b"OMP_THREAD_LIMIT=")]
        return found[0].split(b"=", 1)[1].decode() if found else None

    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    assert worker_limit() == "1" and "OMP_THREAD_LIMIT" not in os.environ
    monkeypatch.setenv("OMP_THREAD_LIMIT", "4")
    assert worker_limit() == "4"


def test_bad_media_names_the_shape_or_dtype():
    scorer = OcrScorer(OcrOptions(), device="cpu")
    with pytest.raises(MediaError, match=r"non-empty images, got shape \(1, 3, 0, 0\)"):
        scorer(torch.zeros(1, 3, 0, 0), [PROMPT], [{}])
    with pytest.raises(MediaError, match="float in \\[0, 1\\], got dtype torch.uint8"):
        scorer(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), [PROMPT], [{}])
    with pytest.raises(ValueError, match="OCR: image 1 is 0×0 pixels"):
        TesseractBackend(threads=1)([Image.new("RGB", (8, 8)), Image.new("RGB", (0, 0))])


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="psm must be one of .* got 0"):
        TesseractBackend(psm=0)
    with pytest.raises(ValueError, match="max_side"):
        TesseractBackend(max_side=8)
    with pytest.raises(ValueError, match="config"):  # the old CLI string: settings are fields now
        TesseractBackend(config="--psm 7")
    backend = TesseractBackend(threads=1, variables={"no_such_variable": "1"})
    with pytest.raises(RuntimeError, match="image 0: ValueError: Tesseract has no variable 'no_such_variable'"):
        backend([Image.new("RGB", (8, 8))])
    backend.close()
    backend = TesseractBackend(threads=1, lang="xx_missing")
    with pytest.raises(RuntimeError, match="could not load language 'xx_missing'"):
        backend([Image.new("RGB", (8, 8))])
    backend.close()


def test_downscale_keeps_small_images_and_scales_the_longer_side():
    rgb = bytes(range(256)) * 3 * 4  # 64×16 pixels
    assert tesseract_pool.downscale(rgb, 64, 16, 64) == (rgb, 64, 16)
    smaller, width, height = tesseract_pool.downscale(rgb, 64, 16, 32)
    assert (width, height) == (32, 8) and len(smaller) == 32 * 8 * 3


def test_bench_report_tables_ocr_variants_against_today(tmp_path):
    row = {"images_per_s": 40.0, "speedup_vs_today": 4.0, "mean_abs_diff_vs_today_text": 0.0,
           "exact_reads_kept": "31/31"}
    data = {"bench": "ocr", "machine": "CPU (2 cores, shared)", "config": {"threads": 2}, "baseline": "today",
            "variants": {"today": {**row, "images_per_s": 10.0, "speedup_vs_today": 1.0}, "library": row}}
    (tmp_path / "ocr.json").write_text(json.dumps(data))
    report = Path(__file__).resolve().parents[1] / "bench" / "report.py"
    out = subprocess.run([sys.executable, str(report), str(tmp_path)], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    line = next(line for line in out.splitlines() if line.startswith("OCR img/s library"))
    assert "40.00 (|Δreward| on text 0.000, exact reads kept 31/31)" in line
    assert line.split()[-2:] == ["4.00", "ocr.json"] and "today 10.00" in line
    assert "OCR img/s today" not in out  # the baseline is no row of its own
