"""Argument types shared by several commands: a bad value is an argparse usage error naming the
option, before any model is loaded."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """A whole number of at least 1 (steps, batch sizes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def video_frames(text: str) -> int:
    """A SANA-Video frame count: ``4k + 1`` (the VAE compresses time by 4 after the first frame)."""
    value = positive_int(text)
    if (value - 1) % 4:
        raise argparse.ArgumentTypeError(f"must be 4k + 1 (1, 5, 9, …, 81), got {value}")
    return value


def finite_float(text: str) -> float:
    """A finite number (``nan`` and ``inf`` parse as floats but sample nothing meaningful)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (rates, scales)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return value


def device(text: str) -> str:
    """A torch device name that exists on this machine (``cpu``, ``cuda``, ``cuda:1``…)."""
    import torch

    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device is available on this machine")
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s)")
    return text
