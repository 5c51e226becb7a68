"""``cosmos-sana make-tiny``: write a random-initialised SANA pipeline folder, offline."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cosmos_sana.tools.tiny_presets import PRESET_CHOICES, REAL_TEXT_ENCODER_LAYERS

if TYPE_CHECKING:
    import torch

HELP = "write a random-initialised SANA / SANA-Video pipeline folder (tiny or real shapes), no network"

_DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Presets: tiny (CPU tests, <1 MB; with --video a tiny SANA-Video), sana-600m, sana-1600m, "
        "sana-video-2b (real transformer and VAE shapes, random weights). Real-shape presets use a "
        f"Gemma2 text encoder with hidden size 2304 but only {REAL_TEXT_ENCODER_LAYERS} layers and a small "
        "offline tokenizer: outputs are noise, shapes and costs are real."
    )
    parser.add_argument("--out", required=True, help="output folder (created; existing files are overwritten)")
    parser.add_argument("--video", action="store_true", help="SanaVideoPipeline (implied by sana-video-2b)")
    parser.add_argument("--preset", choices=PRESET_CHOICES, default="tiny", help="model shapes (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="random-init seed (default: 0)")
    parser.add_argument("--device", default="cpu", help="device to create weights on, e.g. cpu, cuda, cuda:1")
    parser.add_argument("--dtype", choices=_DTYPES, default="float32", help="stored dtype (default: float32)")


def run(args: argparse.Namespace) -> int:
    import time

    import torch

    from cosmos_sana.log import get_logger
    from cosmos_sana.tools.tiny import build_pipeline

    logger = get_logger(__name__)
    dtype = getattr(torch, args.dtype)
    started = time.monotonic()

    def step(what: str) -> None:
        logger.info("make-tiny %s: %s (%.0f s)", args.preset, what, time.monotonic() - started)

    if args.preset != "tiny":  # real shapes: minutes and gigabytes, so say how much first
        logger.info("make-tiny %s: %s", args.preset, size_summary(args.preset, args.video, dtype, args.out))
    out = build_pipeline(
        args.out,
        video=args.video,
        preset=args.preset,
        seed=args.seed,
        device=args.device,
        dtype=dtype,
        progress=step if args.preset != "tiny" else (lambda _: None),
    )
    print(out)
    return 0


def planned_size(preset: str, video: bool, dtype: torch.dtype) -> tuple[dict[str, int], int]:
    """``(parameters per component, bytes of their weights)``, counted on the meta device (no memory used)."""
    import torch

    from cosmos_sana.tools.tiny import parameter_counts

    counts = parameter_counts(preset, video)
    return counts, sum(counts.values()) * torch.empty((), dtype=dtype).element_size()


def size_summary(preset: str, video: bool, dtype: torch.dtype, out: str) -> str:
    counts, total_bytes = planned_size(preset, video, dtype)
    parts = ", ".join(f"{name} {count / 1e6:,.0f} M" for name, count in counts.items())
    return (f"{sum(counts.values()) / 1e9:.2f} B parameters ({parts}), about {total_bytes / 1e9:.1f} GB "
            f"as {str(dtype).removeprefix('torch.')} in {out}")
