"""Checks behind ``cosmos-sana data check``: decode everything on the CPU, report, never raise on a bad sample."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cosmos_sana_plugins.datasets import errors
from cosmos_sana_plugins.datasets.errors import BadSamplePolicy, OnBadSample
from cosmos_sana_plugins.datasets.layouts import discover
from cosmos_sana_plugins.datasets.media import ImageDataset, MediaDataset, VideoDataset
from cosmos_sana_plugins.datasets.params import ImageDataParams, PromptDataParams, VideoDataParams
from cosmos_sana_plugins.datasets.prompts import build_prompts
from cosmos_sana_plugins.datasets.report import DataReport


def is_prompt_source(path: str) -> bool:
    """Prompt files: ``builtin:NAME``, ``.txt``, or a ``.jsonl`` whose first record names no media
    (``media``, or ``file_name`` of a Hugging Face imagefolder)."""
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
            return not (isinstance(record, dict) and ("media" in record or "file_name" in record))
    return False


def check_path(path: str, *, on_bad_sample: OnBadSample, size: tuple[int, int], num_frames: int,
               fps: float | None = None, stride: int = 1, short_clip: str = "error") -> DataReport:
    """Report on a dataset path (any layout, images and videos together, or a prompt file).

    Samples are indexed once for both modalities, so an image entry of a manifest is not a bad
    sample of the video pass (nor the reverse); each modality present is then decoded in full.
    """
    with quiet_skips():
        if is_prompt_source(path):
            report = build_prompts(PromptDataParams(path=path), on_bad_sample="skip").check()
            report.on_bad_sample = on_bad_sample
            return require_samples(report)
        index = BadSamplePolicy("skip", path)
        refs, _ = discover(Path(path), "auto", ("image", "video"), index)
        present = {ref.modality for ref in refs}
        passes: list[MediaDataset] = []
        if "image" in present:
            passes.append(ImageDataset(ImageDataParams(path=path, size=size), size, BadSamplePolicy("skip", path), None))
        if "video" in present:
            params = VideoDataParams(path=path, size=size, num_frames=num_frames, fps=fps, stride=stride,
                                     short_clip=short_clip)
            passes.append(VideoDataset(params, size, num_frames, BadSamplePolicy("skip", path), None))
        reports = [DataReport(path, on_bad_sample, bad=list(index.skipped))]
        for dataset in passes:
            report = dataset.check()
            report.bad = [bad for bad in report.bad if bad not in dataset.policy.skipped]  # indexed above
            reports.append(report)
    return require_samples(merge_reports(path, on_bad_sample, reports))


def require_samples(report: DataReport) -> DataReport:
    """A dataset without one usable sample fails whatever the policy (a run would stop on it)."""
    if report.good == 0:
        report.problems.append("no usable sample found (supported layouts: README 'Data')")
    return report


@contextlib.contextmanager
def quiet_skips() -> Iterator[None]:
    """The report lists every bad sample with its verdict; the skip policy's per-sample
    warnings would repeat them and read as if the run went on under a ``fail`` policy."""
    level = errors.logger.level
    errors.logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        errors.logger.setLevel(level)


def check_dataset(dataset: Any, name: str, on_bad_sample: OnBadSample) -> DataReport:
    """Report on a built dataset: its own ``check()``, else only its length (a third-party dataset)."""
    if hasattr(dataset, "check"):
        report = dataset.check()
        report.dataset = f"{name}: {report.dataset}"
        report.on_bad_sample = on_bad_sample
        return require_samples(report)
    report = DataReport(name, on_bad_sample)
    report.counts["unchecked"] = len(dataset)
    return require_samples(report)


def merge_reports(name: str, on_bad_sample: OnBadSample, reports: list[DataReport]) -> DataReport:
    """One report; a bad sample seen by several passes (an orphan caption, a broken zip) counts once."""
    merged = DataReport(name, on_bad_sample)
    for report in reports:
        merged.counts.update(report.counts)
        merged.resolutions.update(report.resolutions)
        merged.durations.update(report.durations)
        merged.bad.extend(bad for bad in report.bad if bad not in merged.bad)
        merged.problems.extend(problem for problem in report.problems if problem not in merged.problems)
    return merged


class DataChecker:
    """What ``cosmos-sana data check`` calls (``DatasetSpec.checker`` of the built-in datasets): reports on a
    bare path, or on a dataset built from a recipe (any dataset, also another plugin's), quietly."""

    error = errors.DatasetError  # the data as a whole is unusable
    check_path = staticmethod(check_path)
    check_dataset = staticmethod(check_dataset)
    quiet = staticmethod(quiet_skips)


CHECKER = DataChecker()
