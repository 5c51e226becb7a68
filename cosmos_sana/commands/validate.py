"""``cosmos-sana validate FILE.toml``: strict check of a recipe; builds nothing, touches no GPU."""

from __future__ import annotations

import argparse
import sys

HELP = "check a recipe TOML strictly (cosmos-rl sections and [custom]); exit 1 on any issue"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("toml", nargs="+", help="recipe file(s)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a key before validating (TOML value syntax), e.g. train.epoch=2",
    )
    parser.add_argument("--dump", metavar="PATH", help="write the resolved TOML (secrets masked) here")


def run(args: argparse.Namespace) -> int:
    from cosmos_sana.plugin_manager import PluginError, installed_plugins
    from cosmos_sana.validation import ConfigInvalid, validate_file

    try:
        registry = installed_plugins()
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for path in args.toml:
        try:
            data = validate_file(path, args.overrides, registry)
        except ConfigInvalid as exc:
            failed += 1
            print(str(exc), file=sys.stderr)
            print(f"{path}: INVALID ({len(exc.issues)} issue{'s' if len(exc.issues) != 1 else ''})", file=sys.stderr)
            continue
        except ValueError as exc:  # a malformed --set
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{path}: OK")
        if args.dump:
            _dump(data, args.dump)
    return 1 if failed else 0


def _dump(data: dict, path: str) -> None:
    import tomli_w

    from cosmos_sana.redaction import redact

    with open(path, "wb") as handle:
        tomli_w.dump(redact(data), handle)
