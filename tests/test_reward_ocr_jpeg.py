"""OCR (real Tesseract on rendered text, and a plugged-in backend) and JPEG compressibility."""

from __future__ import annotations

import io
import textwrap

import pytest
import torch
from PIL import Image

from cosmos_sana.config import RewardRef
from cosmos_sana.plugin_manager import installed_plugins
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana_plugins.rewards import ocr
from cosmos_sana_plugins.rewards.ocr import levenshtein, ocr_reward, target_text

PROMPT = 'a shop sign that says "Hello World"'


def build(name: str, **args) -> ScorerSet:
    return ScorerSet.build([RewardRef(name=name, args=args)], installed_plugins(), device="cpu")


def test_reference_formula_by_hand():
    assert target_text('a "neon" sign reading "ignored"') == "neon"
    assert levenshtein("kitten", "sitting") == 3
    assert ocr_reward("xx HELLO world!\n", "Hello World") == 1.0  # contained: distance 0
    assert ocr_reward("helo world", "Hello World") == pytest.approx(1 - 1 / 10)
    assert ocr_reward("", "Hello World") == 0.0  # distance capped at len(target)
    assert ocr_reward("a very long unrelated recognised text", "hi") == 0.0
    with pytest.raises(ValueError, match="double quotes"):
        target_text("a sign without quotes")


def test_tesseract_reads_the_quoted_text(render_text):
    scorer = build("ocr")
    media = torch.stack([render_text("Hello World"), render_text("Goodbye Moon")])
    scores = scorer.score(media, [PROMPT, PROMPT]).total
    assert scores[0] == pytest.approx(1.0)
    assert scores[1] < 0.5


def test_video_ocr_averages_sampled_frames_that_score_above_zero(render_text):
    """Frames 0, 4, 8 are read: 'Hello World' (1.0), blank (0, left out), 'Hello' (1 − 5/10).
    The frames in between show other text and must not count."""
    frames = [render_text("Goodbye Moon")] * 9
    frames[0], frames[4], frames[8] = render_text("Hello World"), render_text(""), render_text("Hello")
    video = torch.stack(frames).unsqueeze(0)
    blank = torch.stack([render_text("")] * 5).unsqueeze(0)
    scorer = build("ocr")
    assert scorer.score(video, [PROMPT]).total == pytest.approx([(1.0 + 0.5) / 2])
    assert scorer.score(blank, [PROMPT]).total == [0.0]


def test_ocr_without_quotes_names_the_sample(render_text):
    with pytest.raises(ValueError, match="sample 1: .*double quotes"):
        build("ocr").score(torch.stack([render_text("a")] * 2), [PROMPT, "no quotes here"])


def test_tesseract_runs_one_worker_a_core_up_to_eight(monkeypatch):
    for cores, expected in ((1, 1), (6, 6), (32, 8)):
        monkeypatch.setattr(ocr.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert ocr.TesseractBackend().threads == expected
    assert ocr.TesseractBackend(threads=3).threads == 3
    # refused with the reward's args, before any worker starts (the message names backend_args.threads)
    with pytest.raises(ValueError, match=r"backend_args\.threads: Input should be greater than or equal to 1"):
        build("ocr", backend_args={"threads": 0})


def test_recognition_backend_is_pluggable(tmp_path, monkeypatch):
    (tmp_path / "my_ocr_backend.py").write_text(textwrap.dedent('''
        def make(text):
            return lambda images: [text for _ in images]
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    scorer = build("ocr", backend="my_ocr_backend:make", backend_args={"text": "helo world"})
    assert scorer.score(torch.zeros(1, 3, 8, 8), [PROMPT]).total == pytest.approx([0.9])


def test_jpeg_orders_flat_above_noise_with_reference_sizes():
    flat = torch.full((1, 3, 64, 64), 0.5)
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    media = torch.cat([flat, noise])
    scores = ScorerSet.build(
        [RewardRef(name="jpeg_compressibility"), RewardRef(name="jpeg_incompressibility")], installed_plugins()
    ).score(media, ["", ""]).components
    kilobytes = []
    for sample in media:
        buffer = io.BytesIO()
        array = (sample * 255).round().byte().permute(1, 2, 0).numpy()
        Image.fromarray(array).save(buffer, format="JPEG", quality=95)
        kilobytes.append(buffer.tell() / 1000)
    assert scores["jpeg_incompressibility"] == pytest.approx(kilobytes)
    assert scores["jpeg_compressibility"] == pytest.approx([-kb / 500 for kb in kilobytes])
    assert scores["jpeg_compressibility"][0] > scores["jpeg_compressibility"][1]
