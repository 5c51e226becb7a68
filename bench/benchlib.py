"""Helpers the bench scripts share: timing, memory, environment, model folders, JSON output."""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

#: bf16 dense peak used for MFU (H200: 773–790 TFLOP/s measured with a large bf16 matmul)
PEAK_FLOPS = 790e12
#: the recipe whose defaults the benches' ``recipe`` variants measure
RECIPE = Path(__file__).resolve().parents[1] / "toml" / "sana-image-nft.toml"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
GIB = 2**30


def environment(device: torch.device) -> dict[str, Any]:
    """Date, device name and the versions that decide the numbers."""
    versions = {}
    for package in ("torch", "diffusers", "transformers", "peft", "cosmos-rl", "cosmos-sana"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "device_name": name,
        "python": platform.python_version(),
        "versions": versions,
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device, *, warmup: int = 1, repeats: int = 3) -> list[float]:
    """Seconds per call of ``fn`` (``repeats`` calls after ``warmup``); CUDA events on GPUs."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - began)
    return seconds


def median(values: list[float]) -> float:
    return statistics.median(values)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak allocated accelerator memory since the last reset (None on CPU)."""
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def ensure_pipeline(path: str | None, preset: str, device: torch.device, dtype: torch.dtype, scratch: Path) -> Path:
    """``path`` if it holds a pipeline; else build the random ``preset`` there (or under ``scratch``)."""
    from cosmos_sana.tools.tiny import build_pipeline

    folder = Path(path) if path else scratch / f"pipeline-{preset}"
    if not (folder / "model_index.json").is_file():
        began = time.perf_counter()
        build_pipeline(folder, preset=preset, device=device, dtype=dtype)
        print(f"built {preset} pipeline in {folder} ({time.perf_counter() - began:.1f} s)", flush=True)
    return folder


def write_json(result: dict[str, Any], path: str | None, *, quiet: bool = False) -> None:
    """Write ``result`` to ``path`` when given; print it unless ``quiet`` (partial results)."""
    text = json.dumps(result, indent=1)
    if not quiet:
        print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n", encoding="utf-8")


def ratio(ours: float | None, baseline: float | None) -> float | None:
    return ours / baseline if ours and baseline else None


def profile_top(fn: Callable[[], Any], device: torch.device, top: int = 20) -> dict[str, Any]:
    """The ``top`` operators/kernels of one ``fn()`` call by self time on ``device`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    attribute = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, attribute), reverse=True)
    total = sum(getattr(e, attribute) for e in events)
    return {
        "total_ms": total / 1000,
        "top": [{"name": e.key[:120], "ms": getattr(e, attribute) / 1000, "calls": e.count} for e in events[:top]],
    }


def recipe_settings(path: Path = RECIPE) -> tuple[dict[str, Any], bool]:
    """A recipe's ``[custom.rollout.speed]`` table and whether it turns on gradient checkpointing
    (``policy.model_gradient_checkpointing``): what the benches' ``recipe`` variants run, so that they
    measure what a user of the shipped recipe gets."""
    from cosmos_sana.config.recipe_file import read_toml

    data = read_toml(path)
    speed = data.get("custom", {}).get("rollout", {}).get("speed", {})
    return dict(speed), bool(data.get("policy", {}).get("model_gradient_checkpointing", False))
