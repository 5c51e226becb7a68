"""``cosmos-sana data check <dataset path | recipe TOML>``: decode every sample on the CPU and report.

Prints sample counts per layout/modality, resolution and duration histograms and every bad
sample with its reason. Exit status: 0 when a run would go through, 1 when the configured
``on_bad_sample`` policy would stop it (or no usable sample exists), 2 on a usage error.
A recipe's dataset paths are resolved from the current directory, as in a run.

The checking is the installed dataset plugin's (``DatasetSpec.checker``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cosmos_sana.commands.arg_types import positive_float, positive_int

HELP = "dataset tools: `data check` inspects data without a GPU"
CHECK_HELP = "decode every sample on the CPU; report counts, histograms, every bad sample; exit 1 if a run would fail"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help=CHECK_HELP, description=CHECK_HELP)
    check.add_argument("target", help="dataset folder, .jsonl, .zip, prompt file, builtin:NAME, or a recipe .toml")
    check.add_argument("--on-bad-sample", choices=("fail", "skip"), default="fail",
                       help="policy to judge a dataset path by (a recipe states its own)")
    check.add_argument("--size", type=positive_int, nargs=2, default=(256, 256), metavar=("H", "W"),
                       help="decode size for a dataset path (default 256 256)")
    check.add_argument("--num-frames", type=positive_int, default=81,
                       help="frames per clip for a dataset path (default 81)")
    check.add_argument("--fps", type=positive_float, default=None, help="resample clips to this frame rate")
    check.add_argument("--stride", type=positive_int, default=1, help="take every stride-th frame")
    check.add_argument("--short-clip", choices=("error", "pad_last", "loop"), default="error",
                       help="rule for clips shorter than asked (default error)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from cosmos_sana.plugin_manager import PluginError, installed_plugins

    try:
        registry = installed_plugins()
        checker = data_checker(registry)
    except (PluginError, _UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.target.endswith(".toml"):
            reports = _recipe_reports(args.target, registry, checker)
        else:
            reports = [_path_report(args, checker)]
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (checker.error, _Unusable) as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([report.to_dict() for report in reports], indent=2))
    else:
        print("\n".join(report.render() for report in reports))
    return 1 if any(report.fails for report in reports) else 0


class _UsageError(Exception):
    pass


class _Unusable(Exception):
    """A recipe's dataset as a whole is unusable (its path is missing): the message names its table."""


def data_checker(registry: Any) -> Any:
    """The one ``DatasetSpec.checker`` the installed dataset plugins register (several share it)."""
    from cosmos_sana.specs import resolve

    checkers = {}
    for entry in registry.entries("dataset"):
        if entry.spec.checker is not None:
            checker = resolve(entry.spec.checker)
            checkers.setdefault(id(checker), (checker, []))[1].append(entry.spec.name)
    if len(checkers) != 1:
        found = "; ".join(f"datasets {', '.join(names)}" for _, names in checkers.values()) or "none"
        raise _UsageError(f"`data check` needs exactly one installed dataset checker, found {len(checkers)} ({found})")
    return next(iter(checkers.values()))[0]


def _path_report(args: argparse.Namespace, checker: Any) -> Any:
    return checker.check_path(args.target, on_bad_sample=args.on_bad_sample, size=tuple(args.size),
                      num_frames=args.num_frames, fps=args.fps, stride=args.stride, short_clip=args.short_clip)


def _recipe_reports(path: str, registry: Any, checker: Any) -> list[Any]:
    from cosmos_sana.config import wants_cosmos_sana
    from cosmos_sana.config.recipe_file import ConfigInvalid, read_toml
    from cosmos_sana.plugin_manager import PluginError
    from cosmos_sana.runtime import validation_enabled
    from cosmos_sana.settings import SettingsError, component_params, parse_custom

    try:
        raw = read_toml(path)
    except ConfigInvalid as exc:
        raise _UsageError(str(exc)) from exc
    if not wants_cosmos_sana(raw):
        raise _UsageError(f'{path}: not a cosmos-sana recipe (needs [custom] package = "cosmos-sana")')
    try:
        settings = parse_custom(raw["custom"], source=path)
        reports = []
        for field in ("data", "val_data", "real_data"):
            ref = getattr(settings, field)
            if ref is None:
                continue
            if field == "val_data" and not validation_enabled(raw):
                print(f"custom.val_data ({ref.name}): not checked, a run does not load it ([validation] enable "
                      "is false)", file=sys.stderr)
                continue
            params = component_params(registry, "dataset", ref, f"custom.{field}")
            try:
                with checker.quiet():
                    dataset = registry.get("dataset", ref.name).load()(params, cosmos_config=raw, on_bad_sample="skip")
                    reports.append(checker.check_dataset(dataset, f"custom.{field} ({ref.name})", ref.on_bad_sample))
            except checker.error as exc:
                raise _Unusable(f"custom.{field} ({ref.name}): {exc}") from exc
    except (SettingsError, PluginError) as exc:
        raise _UsageError(str(exc)) from exc
    if not reports:
        raise _UsageError(f"{path}: no [custom.data], [custom.val_data] or [custom.real_data] table")
    return reports
