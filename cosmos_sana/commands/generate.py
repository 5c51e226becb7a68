"""``cosmos-sana generate SOURCE --prompt …``: images/videos from a training checkpoint, an export or a pipeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosmos_sana.commands.arg_types import device, finite_float, positive_int, video_frames

HELP = (
    "generate images (PNG) or videos (MP4) from a training checkpoint (its run's config gives base, LoRA, EMA "
    "and sampling defaults), an export folder or a pipeline folder; --compare-base adds base-vs-trained grids"
)


def parse_size(text: str) -> tuple[int, int]:
    """``512`` → (512, 512); ``480x832`` → (480, 832) as height × width."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"--size {text!r}: expected N or HEIGHTxWIDTH in pixels")
    return parts[0], parts[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="training checkpoint (iter_N or run folder), export folder or pipeline folder")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    parser.add_argument("--prompts", metavar="FILE", help="a text file, one prompt a line")
    parser.add_argument("--out", help="output folder; default: <run>/generated/iter_N for a checkpoint, "
                        "else SOURCE-generated beside the source")
    sampling = parser.add_argument_group("sampling (default: the run's evaluation settings, else 20 steps, CFG 4.5)")
    sampling.add_argument("--steps", type=positive_int, help="denoising steps")
    sampling.add_argument("--guidance", type=finite_float, help="classifier-free guidance scale (1 = off)")
    sampling.add_argument("--size", type=parse_size, help="N or HEIGHTxWIDTH in pixels (default: the run's inference_size)")
    sampling.add_argument("--frames", type=video_frames, help="video frames (4k + 1; video pipelines only)")
    sampling.add_argument("--chi", choices=("off", "image", "video"),
                          help="complex-human-instruction prefix (default: the run's [custom.model] setting, else off)")
    sampling.add_argument("--seed", type=int, default=0, help="image j of every prompt uses seed + j (default 0)")
    sampling.add_argument("--batch", type=positive_int, default=1,
                          help="images per prompt, sampled in one batch (default 1)")
    weights = parser.add_argument_group("weights")
    weights.add_argument("--compare-base", action="store_true",
                         help="also sample the base with the same seeds; writes base/ and compare/ grids (per seed: base | trained)")
    weights.add_argument("--ema", action=argparse.BooleanOptionalAction, default=None,
                         help="checkpoints: use (or not) the EMA weights (default: when the run kept an EMA)")
    weights.add_argument("--adapter", help="checkpoints: LoRA adapter (default: the trained one)")
    weights.add_argument("--base", help="base pipeline folder (default: the one the checkpoint or export recorded)")
    weights.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                         help="weights dtype (default: a checkpoint's run policy.diffusers.dtype; exports and pipelines as stored)")
    weights.add_argument("--device", type=device, help="default: cuda when available, else cpu")


def run(args: argparse.Namespace) -> int:
    import torch

    from cosmos_sana.checkpoint import CheckpointError
    from cosmos_sana.generation import GENERATE_FILE, generate, load_source, read_prompts, resolve_settings
    from cosmos_sana.output_paths import default_generate_dir

    if not sys.stderr.isatty():  # diffusers' loading bar: in a terminal only
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    try:
        prompts = read_prompts(args.prompt, args.prompts)
        loaded = load_source(args.source, base=args.base, ema=args.ema, adapter=args.adapter,
                             dtype=getattr(torch, args.dtype) if args.dtype else None)
        settings = resolve_settings(loaded.run, steps=args.steps, guidance=args.guidance, size=args.size,
                                    frames=args.frames, chi=args.chi)
        out = Path(args.out) if args.out else default_generate_dir(loaded.path, ema=bool(loaded.info.get("ema")))
        record = generate(loaded, prompts, settings, out, batch=args.batch, seed=args.seed,
                          compare_base=args.compare_base, device=args.device)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    written = sum(len(names) for names in record["files"].values())
    print(f"wrote {written} file{'s' if written != 1 else ''} to {out.resolve()} "
          f"(settings: {(out / GENERATE_FILE).resolve()})")
    return 0
