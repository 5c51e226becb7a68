"""``cosmos-sana convert-to-dcp SRC --out DIR``: a pipeline folder or native SANA checkpoint → DCP to train from."""

from __future__ import annotations

import argparse
import sys

HELP = (
    "convert a diffusers pipeline folder (or a native SANA checkpoint with --base) into a DCP folder "
    "(<out>/model, config.json) that training starts from via [custom.checkpoint] init_from; CPU only"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="pipeline folder, or native .pth/.safetensors/.index.json/hf://ORG/REPO/FILE")
    parser.add_argument("--out", required=True, help="output folder (replaced if it is an earlier conversion)")
    parser.add_argument("--base", help="pipeline folder a native checkpoint belongs with (config, VAE, text encoder)")
    parser.add_argument("--chunk-size", default="5GB", help="approximate size of each DCP data file (default 5GB)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="cast weights (default: as stored)")
    parser.add_argument("--native-ema", action="store_true", help="take a native .pth's state_dict_ema")


def run(args: argparse.Namespace) -> int:
    import torch

    from cosmos_sana.checkpoint import CheckpointError, convert_to_dcp

    try:
        out = convert_to_dcp(
            args.source, args.out, base=args.base, chunk_size=args.chunk_size,
            dtype=getattr(torch, args.dtype) if args.dtype else None, native_use_ema=args.native_ema,
        )
    except (CheckpointError, RuntimeError, ValueError, OSError) as exc:  # RuntimeError: a native checkpoint's error
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
