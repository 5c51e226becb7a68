"""``cosmos-sana run RECIPE --local [--set key.path=value ...]``: train a recipe in this process.

Any recipe (SFT or RL, image or video) on the CPU or one GPU, with the components a cosmos-rl
launch registers (model, trainer, rollout, rewards, datasets, DCP checkpoints) driven by
:mod:`cosmos_sana.local_run` instead of cosmos-rl's controller. Like a launch it writes
``<train.output_dir>/<timestamp>/checkpoints/iter_<step>/`` and ``logs/metrics.jsonl``, stops at
``train.max_num_steps``, checkpoints every ``train.ckpt.save_freq`` steps and continues from the
latest complete checkpoint with ``train.resume = true``. Progress goes to stderr (a bar, unless
``[custom.logging] progress_bar = false``), ending with a line naming the last checkpoint and
the safetensors export of the last step; a JSON summary is the last line on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "train a recipe in this process (--local: CPU or one GPU, the same components as a cosmos-rl launch)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="recipe TOML (a path, or relative to the cosmos-sana source checkout)")
    parser.add_argument(
        "--local", action="store_true",
        help="run in this process (required: a multi-GPU run is a cosmos-rl launch, see the README)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe key (TOML value syntax), e.g. train.max_num_steps=6; repeatable",
    )


def find_recipe(name: str) -> Path:
    """``name`` as given, else relative to the source checkout this package runs from."""
    candidates = [Path(name), Path(__file__).resolve().parents[2] / name]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"recipe {name!r} not found (looked in {', '.join(map(str, candidates))})")


def run_recipe(data: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train the validated recipe ``data`` in this process; the run's summary and each step's report."""
    import copy

    from cosmos_sana.checkpoint import list_checkpoints, resolve_resume, runs_root
    from cosmos_sana.compat.cosmos_rl import cosmos_config_class
    from cosmos_sana.local_run import build_components, is_sft, recipe_dataset, total_steps, train_local

    config = cosmos_config_class().from_dict(copy.deepcopy(data))  # appends train.timestamp to output_dir
    kind = "sft" if is_sft(config) else "rl"
    print(
        f"[run] {config.train.train_policy.trainer_type} ({kind}) → {config.train.output_dir}",
        file=sys.stderr, flush=True,
    )
    components = build_components(config)
    trainer = components[0]
    dataset = recipe_dataset(config)
    total = total_steps(config, dataset)
    first = trainer.train_step + 1
    resumed_from = None
    if first > 1:  # the checkpoint the trainer restored: the newest one before this run writes any
        resumed_from = resolve_resume(config.train.resume, runs_root(config.train.output_dir, config.train.timestamp))
        print(f"[run] resumed at step {trainer.train_step} of {total}", file=sys.stderr, flush=True)
    reports = train_local(config, components, steps=total, dataset=dataset)
    checkpoints = list_checkpoints(config.train.output_dir)
    latest = checkpoints[-1] if checkpoints else resumed_from  # nothing left to train: the restored one
    export = latest.parent.parent / "safetensors" / f"step_{trainer.train_step}" if latest else None
    summary = {
        "kind": kind,
        "output_dir": str(config.train.output_dir),
        "first_step": first,
        "last_step": trainer.train_step,
        "total_steps": total,
        "steps_run": len(reports),
        "checkpoint": str(latest) if latest else None,
        "export": str(export) if export and export.is_dir() else None,
        "last_report": {k: v for k, v in (reports[-1] if reports else {}).items() if isinstance(v, (int, float))},
    }
    where = ", ".join(f"{key} {summary[key]}" for key in ("checkpoint", "export") if summary[key]) or "nothing saved"
    print(f"[run] step {trainer.train_step} of {total} done: {where}", file=sys.stderr, flush=True)
    return summary, reports


def run(args: argparse.Namespace) -> int:
    from cosmos_sana.checkpoint import CheckpointError
    from cosmos_sana.plugin_manager import PluginError, installed_plugins
    from cosmos_sana.run_errors import RunStopped
    from cosmos_sana.validation import ConfigInvalid, validate_file

    if not args.local:
        print(
            "error: cosmos-sana run needs --local (one process); launch multi-GPU runs with "
            "`cosmos-rl --config RECIPE cosmos_sana.bridge`",
            file=sys.stderr,
        )
        return 2
    try:
        data = validate_file(find_recipe(args.recipe), args.overrides, installed_plugins(), paths=True)
    except ConfigInvalid as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, PluginError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary, _ = run_recipe(data)
    except RunStopped as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return 1
    except CheckpointError as exc:  # a checkpoint train.resume cannot continue from
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0
