"""Run logging: metrics JSONL, media files, reward summaries, wandb offline and absent."""

from __future__ import annotations

import builtins
import json
import math
import time

import pytest
import torch

from cosmos_sana_plugins.trainers.runlog import RunLog, summarize


def test_summarize_reward_statistics():
    stats = summarize("reward/ocr", [1.0, 2.0, 4.0, 5.0])
    assert stats == {"reward/ocr/mean": 3.0, "reward/ocr/std": math.sqrt(2.5), "reward/ocr/min": 1.0, "reward/ocr/max": 5.0}
    assert summarize("x", []) == {}


def block_import(monkeypatch, module: str) -> None:
    """``import module`` raises ImportError for the rest of the test."""
    real_import = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name == module:
            raise ImportError(f"no {module} here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)


def test_metrics_and_media_on_disk_without_wandb(tmp_path, monkeypatch):
    block_import(monkeypatch, "wandb")
    log = RunLog(tmp_path, use_wandb=True, progress_bar=True, media_count=2)
    log.log(1, {"train/loss": 0.5, "reward/mean": 0.25, "nan": float("nan"), "note": "text"}, total_steps=3)
    log.log(2, {"train/loss": 0.4}, total_steps=3)
    paths = log.media(2, "rollout", torch.rand(3, 3, 8, 8), ["a", "b", "c"])
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    stamps = [line.pop("wall_time") for line in lines]
    assert lines == [{"step": 1, "train/loss": 0.5, "reward/mean": 0.25}, {"step": 2, "train/loss": 0.4}]
    assert time.time() - 60 < stamps[0] <= stamps[1] <= time.time()
    assert [p.name for p in paths] == ["step_000002_0.png", "step_000002_1.png"]


def test_inactive_off_rank_zero(tmp_path):
    log = RunLog(tmp_path, rank=1)
    log.log(1, {"train/loss": 1.0})
    assert log.media(1, "rollout", torch.rand(1, 3, 8, 8), ["a"]) == []
    assert not (tmp_path / "logs").exists()


def test_wandb_offline_run_gets_metrics_and_media(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = RunLog(tmp_path, use_wandb=True, project="p", experiment="e", progress_bar=False, media_count=1)
    log.log(1, {"train/loss": 0.5})
    log.media(1, "rollout", torch.rand(1, 3, 8, 8), ["a"])
    log.close()
    runs = list((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))


def test_video_media_fall_back_to_gif_without_pyav(tmp_path, monkeypatch):
    """PyAV is an optional extra (absent on the GPU image): rollout videos become animated GIFs."""
    from PIL import Image

    block_import(monkeypatch, "av")
    log = RunLog(tmp_path, progress_bar=False, media_count=1, fps=10)
    video = torch.zeros(2, 3, 3, 8, 8)  # B×T×C×H×W
    video[:, 1] = 1.0  # frame 1 white
    (path,) = log.media(1, "rollout", video, ["a", "b"])
    assert path.name == "step_000001_0.gif"
    with Image.open(path) as gif:
        assert gif.n_frames == 3 and gif.info["duration"] == 100  # ms a frame (GIF stores 10 ms units)
        gif.seek(1)
        assert gif.convert("RGB").getpixel((0, 0)) == (255, 255, 255)


def test_a_media_failure_never_ends_the_step(tmp_path, caplog):
    log = RunLog(tmp_path, progress_bar=False, media_count=1)
    with caplog.at_level("WARNING"):
        assert log.media(3, "rollout", torch.rand(1, 8), ["not an image"]) == []  # a sample of shape (8,)
    assert "step 3: could not log rollout media" in caplog.text
