"""``cosmos-sana wheelhouse``: bundle what an air-gapped GPU node lacks into one folder.

Install it on the node with ``launchers/install_offline.sh DIR [SITE]`` (docs/offline_install.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

HELP = "gather wheels (+ redis-server, tesseract) for an offline install on an air-gapped GPU node"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="wheelhouse folder (replaced if it is one)")
    parser.add_argument("--python-version", default="3.12", help="the node's Python, MAJOR.MINOR (default 3.12)")
    parser.add_argument(
        "--platform",
        action="append",
        help="wheel platform tag, repeatable (default: manylinux x86_64 up to glibc 2.28)",
    )
    parser.add_argument(
        "--skip-present",
        type=Path,
        metavar="FILE",
        help="the node's `pip list --format=freeze` (or bare names): skip pins it has at that version "
        "(default: the GPU image of docs/offline_install.md)",
    )
    parser.add_argument("--with-redis", action="store_true", help="carry Debian 12 redis-server 7.0 (+ bin/ wrapper)")
    parser.add_argument(
        "--with-tesseract", action="store_true", help="carry Debian 12 tesseract 5 + English data (OCR reward)"
    )
    parser.add_argument(
        "--system-libs",
        type=Path,
        metavar="FILE",
        help="the node's `ldconfig -p`: don't carry libraries it already has",
    )
    parser.add_argument(
        "--pack", action="store_true", help="store programs as <tool>.tar.xz (smaller; the installer unpacks)"
    )
    parser.add_argument(
        "--lean", action="store_true", help="leave out the wheels that are possibly unneeded (-3.7 MiB)"
    )
    parser.add_argument("--full-botocore", action="store_true", help="keep all botocore service models (+14 MiB)")
    parser.add_argument("--no-project", action="store_true", help="don't build and add cosmos-sana's own wheel")
    parser.add_argument("--max-mib", type=float, default=45.0, help="warn above this total (default 45)")


def run(args: argparse.Namespace) -> int:
    from cosmos_sana import __version__
    from cosmos_sana.tools import wheelhouse as wh

    out: Path = args.out.resolve()
    present_lines = args.skip_present.read_text().splitlines() if args.skip_present else wh.DEFAULT_PRESENT
    present = wh.parse_present(present_lines)
    plan = wh.plan(wh.PINS, present, lean=args.lean)
    platforms = args.platform or wh.DEFAULT_PLATFORMS
    tools = [
        wh.TOOLS[name] for name, wanted in (("redis", args.with_redis), ("tesseract", args.with_tesseract)) if wanted
    ]
    system = set(wh.SYSTEM_SONAMES)
    if args.system_libs:
        system |= wh.parse_sonames(args.system_libs.read_text().splitlines())
    if tools and wh.os_codename() != "bookworm":
        print(
            f"warning: this machine is '{wh.os_codename() or 'not Debian'}', not Debian 12 (bookworm): "
            "apt-get download fetches its own release's builds",
            file=sys.stderr,
        )
    try:
        wh.prepare_out(out)
        with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
            stage = Path(tmp)
            print(f"downloading {len(plan.fetch)} wheels for Python {args.python_version} ...")
            wh.pip_download(plan.fetch, stage, args.python_version, platforms)
            problems = wh.check_pins_fetched(plan.fetch, [w.name for w in stage.glob("*.whl")])
            if problems:
                raise RuntimeError("; ".join(problems))
            saved = 0
            if not args.full_botocore:
                saved = sum(wh.slim_botocore(w) for w in stage.glob("botocore-*.whl"))
            if not args.no_project:
                root = wh.project_root()
                if root is None:
                    raise RuntimeError("no source checkout to build cosmos-sana's wheel from; pass --no-project")
                print("building cosmos-sana's wheel ...")
                wh.build_own_wheel(root, stage)
            for wheel in stage.glob("*.whl"):
                shutil.move(str(wheel), out / wheel.name)
        tool_entries = {}
        for tool in tools:
            print(f"fetching {tool.name} ({len(tool.packages)} Debian packages) ...")
            tool_entries[tool.name] = wh.build_tool(tool, out, system, pack=args.pack)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    wheels = sorted(out.glob("*.whl"))
    groups = {wh.normalize(p.name): p.group for p in wh.PINS}
    needs = wh.node_requirements(wheels, present, args.python_version)
    data = wh.write_manifest(
        out,
        {
            "created_by": f"cosmos-sana {__version__}",
            "python_version": args.python_version,
            "platforms": platforms,
            "wheels": wh.wheel_entries(wheels, groups),
            "botocore_slimmed": None if args.full_botocore else {"kept": list(wh.BOTOCORE_SERVICES), "saved": saved},
            "skipped": plan.skipped,
            "shadows": plan.shadows,
            "left_out": wh.LEFT_OUT,
            "node_requirements": needs,
            "tools": tool_entries,
        },
    )
    for line in wh.describe_sizes(data):
        print(line)
    for row in plan.shadows:
        print(f"note: the node's {row['name']} {row['node']} is shadowed by {row['bundled']}")
    if needs:
        print(textwrap.fill("the node must already have: " + ", ".join(needs), width=100, subsequent_indent="  "))
    if data["total_size"] > args.max_mib * wh.MIB:
        print(f"warning: {data['total_size'] / wh.MIB:.1f} MiB is over --max-mib {args.max_mib:g}", file=sys.stderr)
    print(f"wrote {out / 'MANIFEST.json'}")
    return 0
