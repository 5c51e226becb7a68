"""``cosmos-sana plugins``: everything registered, and which distribution it came from."""

from __future__ import annotations

import argparse
import json

HELP = "list registered models, datasets, packers, rewards, trainers and rollouts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from cosmos_sana.plugin_manager import installed_plugins

    registry = installed_plugins()
    rows = [
        {
            "kind": kind,
            "name": entry.spec.name,
            "plugin": entry.plugin,
            "distribution": entry.distribution,
            "description": entry.spec.description,
        }
        for kind in registry.kinds()
        for entry in registry.entries(kind)
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for kind in registry.kinds():
        entries = [r for r in rows if r["kind"] == kind]
        print(f"{kind}s ({len(entries)}):")
        for r in entries:
            desc = f" — {r['description']}" if r["description"] else ""
            print(f"  {r['name']:<28} {r['distribution']} [{r['plugin']}]{desc}")
    return 0
