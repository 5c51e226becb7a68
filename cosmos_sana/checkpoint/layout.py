"""Where checkpoints live and which of them are complete.

``<root>/checkpoints/iter_<9-digit step>/`` holds one checkpoint. It is written
under a hidden staging name and renamed into place once every part is on disk,
then marked with a ``COMPLETE`` file; anything without that marker is ignored.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from cosmos_sana.checkpoint.dcp_io import CheckpointError
from cosmos_sana.log import get_logger

logger = get_logger(__name__)

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_MARKER = "COMPLETE"
ITER_PATTERN = re.compile(r"^iter_(\d{9})$")
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"


def iter_name(step: int) -> str:
    if not 0 <= step < 10**9:
        raise ValueError(f"step must be in [0, 1e9), got {step}")
    return f"iter_{step:09d}"


def checkpoint_dir(root: str | Path, step: int) -> Path:
    return Path(root) / CHECKPOINTS_DIR / iter_name(step)


def step_of(path: str | Path) -> int:
    match = ITER_PATTERN.match(Path(path).name)
    if not match:
        raise CheckpointError(f"{path}: not a checkpoint folder (expected a name like iter_000000100)")
    return int(match.group(1))


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def write_marker(folder: Path, **info: object) -> None:
    """The completion marker, written last (its presence means every other file is final)."""
    payload = {"completed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info}
    marker = folder / COMPLETE_MARKER
    tmp = folder / f".{COMPLETE_MARKER}.tmp"
    tmp.write_text(json.dumps(payload) + "\n", encoding="utf-8")
    os.replace(tmp, marker)


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints directly under ``<root>/checkpoints``, oldest step first."""
    folder = Path(root) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and ITER_PATTERN.match(p.name) and is_complete(p)]
    return sorted(found, key=step_of)


def find_latest(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root``.

    Looks in ``<root>/checkpoints`` and in ``<root>/*/checkpoints`` (cosmos-rl puts
    each run in a timestamped subfolder of ``train.output_dir``); on equal steps the
    most recently completed wins.
    """
    root = Path(root)
    candidates = list_checkpoints(root)
    if root.is_dir():
        for child in sorted(root.iterdir()):
            if child.is_dir() and child.name != CHECKPOINTS_DIR:
                candidates += list_checkpoints(child)
    if not candidates:
        return None
    return max(candidates, key=lambda p: (step_of(p), (p / COMPLETE_MARKER).stat().st_mtime))


def runs_root(output_dir: str | Path, timestamp: str | None = None) -> Path:
    """Where ``train.resume = true`` searches: cosmos-rl appends ``train.timestamp`` to
    ``train.output_dir`` for every run, so a new run must look one level up."""
    output_dir = Path(output_dir)
    return output_dir.parent if timestamp and output_dir.name == timestamp else output_dir


def resolve_resume(resume: bool | str | None, root: str | Path) -> Path | None:
    """cosmos-rl's ``train.resume``: ``true`` → latest under ``root`` (None when there is none);
    a path → that checkpoint (or the latest under it); ``false``/empty → None."""
    if resume is None or resume is False or resume == "":
        return None
    if resume is True:
        latest = find_latest(root)
        if latest is None:
            logger.info("resume=true but no complete checkpoint under %s: starting fresh", root)
        return latest
    path = Path(resume).expanduser()
    if not path.exists():
        raise CheckpointError(f"train.resume: {path} does not exist")
    if ITER_PATTERN.match(path.name):
        if not is_complete(path):
            raise CheckpointError(f"train.resume: {path} has no {COMPLETE_MARKER} marker (partially written checkpoint)")
        return path
    latest = find_latest(path)
    if latest is None:
        raise CheckpointError(f"train.resume: no complete checkpoint under {path}")
    return latest


def remove_checkpoint(path: Path) -> None:
    """Unmark first, so an interrupted removal never leaves a marked but partial folder."""
    (path / COMPLETE_MARKER).unlink(missing_ok=True)
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash)


def publish(staging: Path, final: Path) -> None:
    """Move a fully written staging folder to ``final`` (replacing an older one)."""
    if final.exists():
        remove_checkpoint(final)
    os.replace(staging, final)


def prune(root: str | Path, keep_last: int | None) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (None or -1: keep all)."""
    if keep_last is None or keep_last < 0:
        return []
    if keep_last == 0:
        raise ValueError("keep_last must be ≥ 1, or -1 to keep every checkpoint")
    doomed = list_checkpoints(root)[:-keep_last]
    for path in doomed:
        logger.info("removing old checkpoint %s", path)
        remove_checkpoint(path)
    return doomed


def clear_stale(root: str | Path) -> None:
    """Staging and trash folders left behind by an interrupted run."""
    folder = Path(root) / CHECKPOINTS_DIR
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.startswith((STAGING_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(path, ignore_errors=True)
