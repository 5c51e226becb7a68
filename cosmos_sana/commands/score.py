"""``cosmos-sana score``: score image/video files with the rewards the trainers use; one JSON line per file."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "score images or videos with registered rewards; prints one JSON line per file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="images (png, jpg, …) or videos (mp4, webm, …)")
    parser.add_argument("--reward", action="append", default=[], metavar="NAME[=WEIGHT]",
                        help="a registered reward (repeatable); see `cosmos-sana plugins`")
    parser.add_argument("--reward-args", action="append", default=[], metavar="NAME:JSON",
                        help='a reward\'s args, e.g. \'pickscore:{"model": "/models/PickScore_v1"}\'')
    parser.add_argument("--config", metavar="RECIPE.toml", help="take [[custom.rewards]] from a recipe instead")
    parser.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                        help="the prompt: once for all files, or once per file in order")
    parser.add_argument("--device", default="cpu", help="scoring device, e.g. cpu or cuda:0 (default: cpu)")


def run(args: argparse.Namespace) -> int:
    from cosmos_sana.plugin_manager import PluginError, installed_plugins
    from cosmos_sana.rewards.client import RemoteRewardError
    from cosmos_sana.rewards.media_files import load_media
    from cosmos_sana.rewards.scorers import ScorerSet
    from cosmos_sana.rewards.selection import SelectionError, select_rewards
    from cosmos_sana.settings import SettingsError

    prompts = args.prompt or [""]
    if len(prompts) not in (1, len(args.files)):
        print(f"error: {len(prompts)} --prompt values for {len(args.files)} files (give 1 or {len(args.files)})",
              file=sys.stderr)
        return 2
    prompts = prompts * len(args.files) if len(prompts) == 1 else prompts
    try:
        refs, _ = select_rewards(args.reward, args.reward_args, args.config)
        scorers = ScorerSet.build(refs, installed_plugins(), device=args.device)
    except (SelectionError, SettingsError, PluginError, KeyError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path, prompt in zip(args.files, prompts):
        try:
            media = load_media(path)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            scores = scorers.score(media.unsqueeze(0).to(args.device), [prompt])
        except ValueError as exc:  # a reward that cannot score this input, e.g. OCR without a quoted target
            hint = "; give the prompt with --prompt" if not args.prompt else ""
            print(f"error: {path}: {exc}{hint}", file=sys.stderr)
            return 2
        except RemoteRewardError as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
        line = {"file": path, "prompt": prompt, "total": scores.total[0],
                "scores": {name: values[0] for name, values in scores.components.items()}}
        print(json.dumps(line), flush=True)
    return 0
