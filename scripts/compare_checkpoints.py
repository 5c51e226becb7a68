#!/usr/bin/env python3
"""Compare two cosmos-sana training checkpoints: ``compare_checkpoints.py A B``.

A and B are checkpoint folders (``…/checkpoints/iter_<step>``) or run folders (their latest
complete checkpoint). Prints JSON: per tensor group (part, LoRA adapter) the number of entries,
how many differ, the largest absolute difference and whether all are bit-identical; then
``bit_identical`` overall. Exit status: 0 identical, 1 different, 2 unreadable.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="checkpoint or run folder")
    parser.add_argument("b", help="checkpoint or run folder")
    args = parser.parse_args(argv)
    from cosmos_sana.checkpoint.compare import compare_checkpoints
    from cosmos_sana.checkpoint.dcp_io import CheckpointError

    try:
        report = compare_checkpoints(args.a, args.b)
    except (CheckpointError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0 if report["bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
