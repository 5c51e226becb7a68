"""``cosmos-sana make-tiny``: write a random-initialised SANA pipeline folder, offline."""

from __future__ import annotations

import argparse

from cosmos_sana.tiny_presets import PRESET_CHOICES, REAL_TEXT_ENCODER_LAYERS

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
    import torch

    from cosmos_sana.tiny import build_pipeline

    out = build_pipeline(
        args.out,
        video=args.video,
        preset=args.preset,
        seed=args.seed,
        device=args.device,
        dtype=getattr(torch, args.dtype),
    )
    print(out)
    return 0
