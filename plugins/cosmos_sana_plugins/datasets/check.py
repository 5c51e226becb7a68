"""Checks behind ``cosmos-sana data check``: decode everything on the CPU, report, never raise on a bad sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosmos_sana_plugins.datasets.errors import BadSamplePolicy, OnBadSample
from cosmos_sana_plugins.datasets.media import ImageDataset, VideoDataset
from cosmos_sana_plugins.datasets.params import ImageDataParams, PromptDataParams, VideoDataParams
from cosmos_sana_plugins.datasets.prompts import build_prompts
from cosmos_sana_plugins.datasets.report import DataReport


def is_prompt_source(path: str) -> bool:
    """Prompt files: ``builtin:NAME``, ``.txt``, or a ``.jsonl`` whose first record has no ``media``."""
    if path.startswith("builtin:"):
        return True
    file = Path(path)
    if file.suffix.lower() == ".txt":
        return True
    if file.suffix.lower() != ".jsonl" or not file.is_file():
        return False
    for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return False
            return not (isinstance(record, dict) and "media" in record)
    return False


def check_path(path: str, *, on_bad_sample: OnBadSample, size: tuple[int, int], num_frames: int,
               fps: float | None = None, stride: int = 1, short_clip: str = "error") -> DataReport:
    """Report on a dataset path (any layout, images and videos together, or a prompt file)."""
    if is_prompt_source(path):
        dataset = build_prompts(PromptDataParams(path=path), on_bad_sample="skip")
        report = dataset.check()
        report.on_bad_sample = on_bad_sample
        return report
    images = ImageDataset(ImageDataParams(path=path, size=size), size, BadSamplePolicy("skip", path), None)
    videos = VideoDataset(VideoDataParams(path=path, size=size, num_frames=num_frames, fps=fps, stride=stride,
                                          short_clip=short_clip),
                          size, num_frames, BadSamplePolicy("skip", path), None)
    return merge_reports(path, on_bad_sample, [images.check(), videos.check()])


def check_dataset(dataset: Any, name: str, on_bad_sample: OnBadSample) -> DataReport:
    """Report on a built dataset: its own ``check()``, else only its length (a third-party dataset)."""
    if hasattr(dataset, "check"):
        report = dataset.check()
        report.dataset = f"{name}: {report.dataset}"
        report.on_bad_sample = on_bad_sample
        return report
    report = DataReport(name, on_bad_sample)
    report.counts["unchecked"] = len(dataset)
    return report


def merge_reports(name: str, on_bad_sample: OnBadSample, reports: list[DataReport]) -> DataReport:
    """One report; a bad sample seen by several passes (an orphan caption, a broken zip) counts once."""
    merged = DataReport(name, on_bad_sample)
    for report in reports:
        merged.counts.update(report.counts)
        merged.resolutions.update(report.resolutions)
        merged.durations.update(report.durations)
        merged.bad.extend(bad for bad in report.bad if bad not in merged.bad)
    return merged
