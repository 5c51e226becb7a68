"""Default output folders of ``export`` and ``generate``: beside what they read, never relative to the
directory the command happened to start in.

A training checkpoint ``<run>/checkpoints/iter_N`` exports to ``<run>/exports/iter_N-<format>`` and
generates into ``<run>/generated/iter_N``; any other source folder ``X`` (a ``convert-to-dcp`` folder,
an export, a pipeline) gets siblings ``X-<format>`` / ``X-generated``. Checkpoint folders themselves
are never written into (``keep_last`` pruning deletes them).
"""

from __future__ import annotations

from pathlib import Path

from cosmos_sana.checkpoint.layout import CHECKPOINTS_DIR

EXPORTS_DIR = "exports"
GENERATED_DIR = "generated"


def run_root(checkpoint: Path) -> Path | None:
    """``<run>`` of a training checkpoint ``<run>/checkpoints/iter_N``; None for any other folder."""
    checkpoint = checkpoint.resolve()
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS_DIR else None


def default_export_dir(checkpoint: Path, fmt: str, *, ema: bool = False, adapter: str | None = None) -> Path:
    suffix = f"-{fmt}" + (f"-{adapter}" if adapter else "") + ("-ema" if ema else "")
    root = run_root(checkpoint)
    if root is not None:
        return root / EXPORTS_DIR / f"{checkpoint.resolve().name}{suffix}"
    source = checkpoint.resolve()
    return source.with_name(f"{source.name}{suffix}")


def default_generate_dir(source: Path, *, ema: bool = False) -> Path:
    suffix = "-ema" if ema else ""
    root = run_root(source)
    if root is not None:
        return root / GENERATED_DIR / f"{source.resolve().name}{suffix}"
    resolved = source.resolve()
    return resolved.with_name(f"{resolved.name}-{GENERATED_DIR}{suffix}")
