"""``cosmos-sana``: the command-line front door.

Each subcommand lives in its own module exposing ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``; modules are imported only when their command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from cosmos_sana.log import quiet_third_party, redacted_stderr

VERBOSE_HELP = "also show other packages' known-harmless start-up warnings (hidden by default)"

#: subcommand → module (add a line here to add a command)
COMMANDS: dict[str, str] = {
    "run": "cosmos_sana.commands.run",
    "demo": "cosmos_sana.commands.demo",
    "data": "cosmos_sana.commands.data_check",
    "plugins": "cosmos_sana.commands.plugins",
    "validate": "cosmos_sana.commands.validate",
    "make-tiny": "cosmos_sana.commands.make_tiny",
    "convert-native": "cosmos_sana.commands.convert_native",
    "wheelhouse": "cosmos_sana.commands.wheelhouse",
    "score": "cosmos_sana.commands.score",
    "reward-server": "cosmos_sana.commands.reward_server",
    "convert-to-dcp": "cosmos_sana.commands.convert_to_dcp",
    "export": "cosmos_sana.commands.export",
    "generate": "cosmos_sana.commands.generate",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosmos-sana", description="Post-train SANA with cosmos-rl.")
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    common = argparse.ArgumentParser(add_help=False)  # -v also after the command name
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name, module_name in COMMANDS.items():
        if wanted is None or name == wanted:
            module = importlib.import_module(module_name)
            cmd = sub.add_parser(name, help=module.HELP, description=module.HELP, parents=[common])
            module.add_arguments(cmd)
            cmd.set_defaults(_run=module.run)
        else:  # another command runs: its siblings' help is never shown, so import nothing
            sub.add_parser(name)
    return parser


def _version() -> str:
    from cosmos_sana import __version__

    return f"cosmos-sana {__version__}"


def wants_verbose(argv: list[str]) -> bool:
    """``-v``/``--verbose`` anywhere before a ``--`` (read before any command module is imported)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "-v" in options or "--verbose" in options


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not wants_verbose(argv):
        quiet_third_party()
    with redacted_stderr():  # usage errors quote the values given too
        args = build_parser(argv).parse_args(argv)
        return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
