"""``cosmos-sana export CKPT --out DIR``: a DCP checkpoint → diffusers / LoRA / merged / native SANA."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosmos_sana.commands.arg_types import device, positive_int, video_frames

HELP = (
    "export a DCP checkpoint (training iter_N folder, a training output dir = its latest, or a convert-to-dcp "
    "folder) as a diffusers pipeline, a LoRA (diffusers + PEFT), LoRA merged into the base, a native SANA .pth, "
    "or a ComfyUI LoRA; every export has a model card (README.md)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint folder, or a training output dir (latest complete checkpoint)")
    parser.add_argument(
        "--out", help="export folder (a previous export there is replaced once the new one is complete and "
        "verified; it may not be, hold or lie inside the checkpoint or the base); default: <run>/exports/iter_N-FORMAT "
        "for a training checkpoint, else CHECKPOINT-FORMAT beside it",
    )
    parser.add_argument(
        "--format", default="auto", choices=("auto", "diffusers", "lora", "merged", "native", "comfyui"),
        help="auto: lora for LoRA checkpoints, diffusers otherwise; comfyui: the LoRA for ComfyUI's LoRA loader",
    )
    parser.add_argument("--ema", action="store_true", help="export the EMA weights instead of the trained ones")
    parser.add_argument(
        "--base", help="base pipeline folder (default: the one recorded in the checkpoint); a LoRA still goes onto "
        "the native checkpoint or init_from weights its run started from",
    )
    parser.add_argument("--adapter", help="LoRA adapter to export (default: the trained one, e.g. 'default')")
    parser.add_argument(
        "--native-checkpoint", help="where the native checkpoint the run started from is now (default: the path "
        "recorded in the checkpoint's run_config.json)",
    )
    parser.add_argument("--init-from", help="where the run's init_from folder is now (default: as recorded)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="transformer dtype (default: as stored)")
    parser.add_argument("--max-shard-size", default="5GB", help="safetensors shard size for pipeline exports")
    verify = parser.add_argument_group("verification")
    verify.add_argument("--verify", action="store_true", help="load the export, generate once, reject NaN/constant output")
    verify.add_argument("--verify-size", type=positive_int, default=256, help="square resolution of the test sample (default 256)")
    verify.add_argument("--verify-steps", type=positive_int, default=2, help="sampling steps (default 2)")
    verify.add_argument("--verify-frames", type=video_frames, default=5, help="frames for video pipelines (4k+1, default 5)")
    verify.add_argument("--device", type=device, help="device for --verify (default: cuda if available, else cpu)")
    parser.add_argument("--push-to-hub", metavar="REPO",
                        help="upload the export to this Hugging Face Hub model repo (created private)")
    parser.add_argument("--public", action="store_true", help="with --push-to-hub: create the repo public")


def run(args: argparse.Namespace) -> int:
    import torch

    from cosmos_sana.checkpoint import CheckpointError
    from cosmos_sana.export import VerificationFailed, VerifyOptions, export_checkpoint
    from cosmos_sana.export.hub import HubPushError, check_can_push, push_to_hub

    if args.push_to_hub:
        try:
            check_can_push(args.push_to_hub)
        except HubPushError as exc:
            print(f"error: {exc}; nothing exported", file=sys.stderr)
            return 1
    verify = None
    if args.verify:
        verify = VerifyOptions(
            height=args.verify_size, width=args.verify_size, steps=args.verify_steps,
            frames=args.verify_frames, device=args.device,
        )
    try:
        out = Path(args.out) if args.out else default_out(args)
        out = export_checkpoint(
            args.checkpoint, out, fmt=args.format, ema=args.ema, base=args.base, adapter=args.adapter,
            dtype=getattr(torch, args.dtype) if args.dtype else None, max_shard_size=args.max_shard_size, verify=verify,
            native_checkpoint=args.native_checkpoint, init_from=args.init_from,
        )
    except VerificationFailed as exc:
        print(f"error: verification failed, nothing exported: {exc}", file=sys.stderr)
        return 2
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"exported to {out.resolve()}")
    if args.push_to_hub:
        try:
            print(f"pushed to {push_to_hub(out, args.push_to_hub, public=args.public)}")
        except HubPushError as exc:
            print(f"error: {exc} (the export is at {out.resolve()})", file=sys.stderr)
            return 1
    return 0


def default_out(args: argparse.Namespace) -> Path:
    """Beside the checkpoint (see :mod:`cosmos_sana.output_paths`), named by the resolved format."""
    from cosmos_sana.export.api import resolve_format
    from cosmos_sana.export.restore import open_source
    from cosmos_sana.output_paths import default_export_dir

    source = open_source(args.checkpoint, args.base, native_checkpoint=args.native_checkpoint, init_from=args.init_from)
    return default_export_dir(source.path, resolve_format(args.format, source), ema=args.ema, adapter=args.adapter)
