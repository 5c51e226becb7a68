"""``cosmos-sana validate FILE.toml``: strict check of a recipe's keys, values and local paths;
builds nothing, touches no GPU."""

from __future__ import annotations

import argparse
import sys

HELP = "check a recipe TOML strictly (keys, values, local paths); exit 1 listing every issue"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("toml", nargs="+", help="recipe file(s)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a key before validating (TOML value syntax), e.g. train.epoch=2",
    )
    parser.add_argument(
        "--dump", metavar="PATH",
        help="write the resolved TOML here exactly as it will run (nothing masked; readable by the owner only)",
    )
    parser.add_argument(
        "--no-path-check", dest="paths", action="store_false",
        help="skip checking that local paths exist (model, data, init_from, native checkpoint), "
        "e.g. for a recipe meant for another machine",
    )
    parser.add_argument(
        "--no-startup-check", dest="startup_check", action="store_false",
        help="skip only cosmos-rl's policy-worker start-up check (the trainer-type lookup, batch "
        "divisibility) and the trainer's own check_config, which import torch and all of cosmos-rl; "
        "the launchers pass it unless COSMOS_SANA_FAST_STARTUP=0 or in a dry run (which keeps the full check), "
        "since the controller then runs that check",
    )


def run(args: argparse.Namespace) -> int:
    from cosmos_sana.compat.cosmos_rl import package_bodies_deferred

    # a recipe with a wrong key or value is reported in well under a second; only a recipe that
    # passes those checks pays for the imports of cosmos-rl's policy-worker start-up check
    with package_bodies_deferred():
        return _validate_all(args)


def _validate_all(args: argparse.Namespace) -> int:
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
            data = validate_file(path, args.overrides, registry, paths=args.paths, startup_check=args.startup_check)
        except ConfigInvalid as exc:
            failed += 1
            print(_shown(str(exc), path, args.overrides), file=sys.stderr)
            print(f"{path}: INVALID ({len(exc.issues)} issue{'s' if len(exc.issues) != 1 else ''})", file=sys.stderr)
            continue
        except ValueError as exc:  # a malformed --set
            print(f"error: {_shown(str(exc), path, args.overrides)}", file=sys.stderr)
            return 2
        # without the start-up check the recipe is not known to start: say which part is left
        print(f"{path}: OK" if args.startup_check else f"{path}: OK (policy-worker start-up check not run)")
        if args.dump:
            try:
                _dump(data, args.dump)
            except OSError as exc:
                print(f"error: --dump {args.dump}: {exc.strerror or exc}", file=sys.stderr)
                return 2
    return 1 if failed else 0


def _shown(message: str, path: str, overrides: list[str]) -> str:
    """``message`` with secrets masked: secret environment values, token-shaped text, and the
    values the recipe (with its overrides) gives secret keys such as ``hf_token``."""
    from cosmos_sana.redaction import redact_text, secret_config_values
    from cosmos_sana.validation import ConfigInvalid, load_toml

    try:
        data = load_toml(path, overrides)
    except (ConfigInvalid, ValueError, OSError):
        data = {}
    return redact_text(message, extra=secret_config_values(data))


def _dump(data: dict, path: str) -> None:
    """The resolved TOML the launcher runs: every value as given (a masked value would change the
    run), created readable by its owner only since the recipe may hold credentials."""
    import os

    import tomli_w

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as handle:
        tomli_w.dump(data, handle)
