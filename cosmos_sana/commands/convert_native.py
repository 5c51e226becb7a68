"""``cosmos-sana convert-native SRC --base PIPELINE --out DIR``: native SANA checkpoint → diffusers folder.

The model plugin serving ``--base``'s pipeline class converts (``ModelSpec.native_converter``)."""

from __future__ import annotations

import argparse
import sys

HELP = (
    "turn a native SANA transformer checkpoint (.pth / .safetensors / sharded index, hf://ORG/REPO/FILE or"
    " $SANA_NATIVE_MODEL_PATH) into a diffusers pipeline folder; every other component is copied from --base"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", default=None, help="native checkpoint (default: $SANA_NATIVE_MODEL_PATH)")
    parser.add_argument("--base", required=True, help="diffusers pipeline folder giving config, VAE, text encoder, …")
    parser.add_argument("--out", required=True, help="new pipeline folder (must not exist or be empty)")
    parser.add_argument("--ema", action="store_true", help="use the checkpoint's 'state_dict_ema'")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), default=None,
        help="cast the transformer (default: keep the checkpoint's dtype)",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from cosmos_sana.checkpoint.dcp_io import CheckpointError
    from cosmos_sana.checkpoint.pipeline_folder import pipeline_class_name
    from cosmos_sana.model_hooks import NoModelTool, model_tool

    try:
        convert = model_tool(pipeline_class_name(args.base), "native_converter")
        out = convert(
            args.source, base=args.base, out=args.out, use_ema=args.ema,
            torch_dtype=getattr(torch, args.dtype) if args.dtype else None,
        )
    except (CheckpointError, NoModelTool) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
