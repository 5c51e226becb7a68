"""``cosmos-sana demo``: post-train the embedded tiny SANA on the bundled prompts, then export.

With an NVIDIA GPU, Redis and cosmos-rl's launcher available: a real
``cosmos-rl --config`` launch (controller, Redis, torchrun workers, colocated).
On a CPU-only machine (cosmos-rl's launcher refuses to start without a GPU and
its workers need NCCL): ``cosmos-sana run --local`` of the same recipe (same
registered trainer, rollout, rewards and checkpoint code, one process). Both end
with a LoRA export loaded back through stock diffusers and one generated image.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HELP = "post-train a tiny SANA built offline on bundled prompts, then export it (GPU: real cosmos-rl launch)"
DEFAULT_RECIPE = "toml/tiny/sana-image-nft.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/demo", help="output folder (default: ./outputs/demo)")
    parser.add_argument("--steps", type=int, default=20, help="RL steps (default: 20)")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe (default: {DEFAULT_RECIPE})")
    parser.add_argument(
        "--mode", choices=("auto", "launch", "local"), default="auto",
        help="launch: cosmos-rl --config (needs a GPU); local: one process; auto: launch when possible",
    )


def can_launch() -> tuple[bool, str]:
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    for program in ("nvidia-smi", "redis-server", "cosmos-rl"):
        if shutil.which(program) is None:
            return False, f"{program} not on PATH"
    return True, "GPU, redis-server and cosmos-rl found"


def resolve(recipe: Path, out: Path, steps: int) -> dict[str, Any]:
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.tools.tiny import build_pipeline
    from cosmos_sana.validation import validate_file

    model = out / "model"
    if not (model / "model_index.json").is_file():
        build_pipeline(model)
    overrides = [
        f"policy.model_name_or_path={json.dumps(str(model.resolve()))}",
        f"train.output_dir={json.dumps(str((out / 'run').resolve()))}",
        f"train.max_num_steps={steps}",
        f"train.ckpt.save_freq={steps}",
    ]
    return validate_file(recipe, overrides, installed_plugins())


def run_launch(data: dict[str, Any], out: Path) -> None:
    import tomli_w

    resolved = out / "demo.toml"
    with resolved.open("wb") as handle:
        tomli_w.dump(data, handle)
    print(f"[demo] cosmos-rl --config {resolved}", file=sys.stderr, flush=True)
    subprocess.run(["cosmos-rl", "--config", str(resolved)], check=True)


def export(run_dir: Path, out: Path) -> Path:
    from cosmos_sana.checkpoint import find_latest, runs_root
    from cosmos_sana.export import export_checkpoint
    from cosmos_sana.export.verify import VerifyOptions

    latest = find_latest(runs_root(run_dir))
    if latest is None:
        raise RuntimeError(f"no complete checkpoint under {run_dir}")
    target = out / "export-lora"
    export_checkpoint(latest, target, fmt="lora", verify=VerifyOptions(height=64, width=64, steps=4))
    return target


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from cosmos_sana.commands.run import find_recipe, run_recipe

    recipe = find_recipe(args.recipe)
    mode = args.mode
    if mode == "auto":
        ok, why = can_launch()
        mode = "launch" if ok else "local"
        print(f"[demo] {why}: {'real cosmos-rl launch' if ok else 'single-process run of the same components'}",
              file=sys.stderr)
    from cosmos_sana.plugin_manager import PluginError
    from cosmos_sana.validation import ConfigInvalid

    try:
        data = resolve(recipe, out, args.steps)
    except ConfigInvalid as exc:  # as `cosmos-sana run`: the problems, one a line, and status 1
        print(str(exc), file=sys.stderr)
        return 1
    except (ValueError, PluginError) as exc:  # e.g. a COSMOS_SANA_FAST_STARTUP value that is neither 0 nor 1
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if mode == "launch":
        run_launch(data, out)
        summary: dict[str, Any] = {"mode": "launch"}
    else:
        _, reports = run_recipe(data)
        rewards = [r["reward/mean"] for r in reports]
        k = max(1, min(5, len(rewards) // 2))
        summary = {
            "mode": "local",
            "steps": len(rewards),
            "reward_first": sum(rewards[:k]) / k,
            "reward_last": sum(rewards[-k:]) / k,
        }
    summary["export"] = str(export(Path(data["train"]["output_dir"]), out))
    print(json.dumps(summary))
    return 0

