"""Reward curve and step time of an RL recipe on a random-initialised SANA, in one process.

    python bench/bench_tiny_rl.py [--recipe toml/tiny/sana-image-nft.toml] [--steps 60] \
        [--set train.optm_lr=3e-3 ...] [--json out.json]

Runs the recipe's registered trainer and ``sana`` rollout through
:func:`cosmos_sana_plugins.trainers.local_loop.run_local` (no controller, redis or NCCL) on a
fresh ``tiny`` pipeline (or ``policy.model_name_or_path`` when it holds one). Prints one JSON
object: per-step mean reward and seconds per step.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch
from benchlib import environment, write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="toml/tiny/sana-image-nft.toml")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()

    from cosmos_sana.compat.cosmos_rl import cosmos_config_class
    from cosmos_sana.validation import load_toml
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    with tempfile.TemporaryDirectory() as scratch:
        data = load_toml(args.recipe, args.overrides)
        if not (Path(data["policy"]["model_name_or_path"]) / "model_index.json").is_file():
            from cosmos_sana.tools.tiny import build_pipeline

            video = data["policy"].get("diffusers", {}).get("is_video", False)
            data["policy"]["model_name_or_path"] = str(build_pipeline(Path(scratch) / "pipeline", video=video))
        data["train"]["output_dir"] = str(Path(scratch) / "run")
        data["train"]["ckpt"] = {**data["train"].get("ckpt", {}), "enable_checkpoint": False}
        data.setdefault("custom", {})["logging"] = {"progress_bar": False}
        config = cosmos_config_class().from_dict(copy.deepcopy(data))
        components = build_components(config)
        started = time.perf_counter()
        reports = run_local(config, args.steps, components)
        seconds = time.perf_counter() - started
    rewards = [r["reward/mean"] for r in reports]
    result = {
        "bench": "tiny_rl",
        "recipe": args.recipe,
        "overrides": args.overrides,
        "steps": args.steps,
        "reward_mean_per_step": rewards,
        "reward_first5": sum(rewards[:5]) / min(5, len(rewards)),
        "reward_last5": sum(rewards[-5:]) / min(5, len(rewards)),
        "seconds_per_step": seconds / args.steps,
        "environment": environment(torch.device("cpu")),
    }
    write_json(result, args.json)


if __name__ == "__main__":
    main()
