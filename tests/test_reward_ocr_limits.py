"""The OCR reward's read limits: a page split into more than ``max_words`` word candidates, or a read
past ``cpu_limit_ms`` of CPU time, reads as no text and is counted; the worker's CPU time for such a
read is bounded; real text still reads exactly; bad settings are named."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cosmos_sana_plugins.rewards import ocr, tesseract_pool
from cosmos_sana_plugins.rewards.ocr import TesseractBackend, TesseractOptions

pytestmark = pytest.mark.skipif(tesseract_pool.find_library() is None, reason="libtesseract is not installed")
BENCH_OCR = Path(__file__).resolve().parents[1] / "bench" / "bench_ocr.py"


def striped_field() -> Image.Image:
    """One of bench_ocr's fields of fine stripes (seed 1: ~0.4 s of one core when read to its end)."""
    spec = importlib.util.spec_from_file_location("bench_ocr", BENCH_OCR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.striped(np.random.default_rng(1))


def worker_cpu_s(backend: TesseractBackend) -> float:
    """User + system CPU seconds of the backend's one worker (``/proc/PID/stat`` fields 14 and 15)."""
    (pid,) = backend.pool.pids()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_read(backend: TesseractBackend, image: Image.Image) -> tuple[str, float]:
    before = worker_cpu_s(backend)
    (text,) = backend([image])
    return text, worker_cpu_s(backend) - before


def pil(tensor) -> Image.Image:
    return ocr.to_pil(tensor.unsqueeze(0))[0]


def test_a_striped_field_reads_as_no_text_at_the_first_candidate_and_text_still_reads(render_text):
    field, texts = striped_field(), ["OPEN LATE", "Ship It", "Night Train"]
    limited, unlimited = TesseractBackend(threads=1), TesseractBackend(threads=1, max_words=None)
    try:
        assert limited.settings.max_words == 150 and unlimited.settings.max_words is None
        for backend in (limited, unlimited):
            backend([pil(render_text("a"))])  # starts the worker, so its start-up is not timed
        cut_text, cut_cpu = timed_read(limited, field)
        _, full_cpu = timed_read(unlimited, field)
        assert cut_text == "" and limited.pool.cut_reads == 1 and unlimited.pool.cut_reads == 0
        assert full_cpu > 0.15 and cut_cpu < full_cpu / 2, (cut_cpu, full_cpu)
        # the worker that stopped a read reads real text after it, exactly, and stops nothing else
        assert [t.strip() for t in limited([pil(render_text(t)) for t in texts])] == texts
        assert limited.pool.cut_reads == 1
    finally:
        limited.close()
        unlimited.close()


def test_a_tiny_cpu_limit_returns_no_text_within_the_layout_time(render_text):
    """1 ms of CPU: every read stops at its first word candidate with no text, even real text (the
    documented return value is no text, never the words read so far); the field costs its layout only."""
    field = striped_field()
    tiny, unlimited = TesseractBackend(threads=1, max_words=None, cpu_limit_ms=1), TesseractBackend(
        threads=1, max_words=None
    )
    try:
        for backend in (tiny, unlimited):
            backend([Image.new("RGB", (8, 8), "white")])  # no word candidate: nothing to stop
        assert tiny.pool.cut_reads == 0
        cut_text, cut_cpu = timed_read(tiny, field)
        _, full_cpu = timed_read(unlimited, field)
        assert cut_text == "" and tiny.pool.cut_reads == 1
        assert cut_cpu < full_cpu / 2, (cut_cpu, full_cpu)
        assert tiny([pil(render_text("OPEN LATE"))]) == [""] and tiny.pool.cut_reads == 2
        assert unlimited([pil(render_text("OPEN LATE"))])[0].strip() == "OPEN LATE"
    finally:
        tiny.close()
        unlimited.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_words": -1}, r"max_words\n  Input should be greater than or equal to 0"),
        ({"max_words": "many"}, r"max_words\n  Input should be a valid integer"),
        ({"cpu_limit_ms": 0}, r"cpu_limit_ms\n  Input should be greater than 0"),
        ({"cpu_limit_ms": float("inf")}, r"cpu_limit_ms\n  Input should be a finite number"),
        ({"engine": "program", "max_words": 150}, "max_words needs the library engine"),
        ({"engine": "program", "cpu_limit_ms": 50}, "cpu_limit_ms needs the library engine"),
    ],
)
def test_bad_limits_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        TesseractOptions(**args)


def test_limits_default_and_are_off_for_the_program():
    assert (TesseractOptions().max_words, TesseractOptions().cpu_limit_ms) == (150, None)
    program = TesseractBackend(threads=1, engine="program")  # the default max_words is not applied to it
    assert (program.settings.max_words, program.settings.cpu_limit_ms) == (None, None)
    assert TesseractOptions(engine="program", max_words=None, cpu_limit_ms=None).engine == "program"


def test_max_words_zero_is_no_limit():
    """A recipe cannot write None (TOML has no null): ``max_words = 0`` is how it reads every page to its end."""
    assert TesseractOptions(max_words=0).max_words is None
    assert TesseractOptions(engine="program", max_words=0).max_words is None  # no limit: fine for the program
    backend = TesseractBackend(threads=1, max_words=0)
    try:
        assert backend.settings.max_words is None
    finally:
        backend.close()


def test_recipe_validation_checks_the_tesseract_backend_args():
    """`cosmos-sana validate` refuses a bad or misspelt `backend_args` key of the built-in backend, naming
    it, instead of the reward failing when first built inside a launch; a custom backend's are its own."""
    from cosmos_sana_plugins.rewards.ocr import OcrOptions

    with pytest.raises(ValueError, match=r"backend_args\.max_words: Input should be greater than or equal to 0"):
        OcrOptions(backend_args={"max_words": -3})
    with pytest.raises(ValueError, match=r"backend_args\.max_word: Extra inputs are not permitted"):
        OcrOptions(backend_args={"max_word": 10})
    assert OcrOptions(backend_args={"max_words": 0, "psm": 11}).backend_args == {"max_words": 0, "psm": 11}
    assert OcrOptions(backend="mypkg.ocr:make", backend_args={"anything": 1}).backend_args == {"anything": 1}
