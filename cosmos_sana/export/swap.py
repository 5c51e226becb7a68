"""Replace an export folder so that the previous export survives any failure, ``kill -9`` included.

An export to ``<out>`` goes through these steps:

1. :func:`recover_output` puts back what an earlier, interrupted export left (below);
2. the new export is written into a sibling ``<out>.staging-<pid>-<token>`` and completed there
   (manifest, then the ``COMPLETE`` marker) — a failure removes it; ``<out>`` is not touched;
3. :func:`swap_in`: rename ``<out>`` → ``<out>.old-<pid>-<token>``, then the staging folder → ``<out>``;
4. the old copy loses its ``COMPLETE`` marker, then is deleted.

What a process killed at any point leaves, and what the next export (or :func:`recover_output`) does:

* during 1–2, or before the first rename of 3: ``<out>`` untouched; a stale staging folder, removed;
* between the two renames of 3: no ``<out>``; the previous export, complete, at ``<out>.old-*`` — it is
  renamed back to ``<out>`` (the unpublished staging folder is removed); until then it is readable there,
  and it stays there while ``<out>`` is something else than empty or a complete export;
* during 4: ``<out>`` is the new export; the partly deleted ``.old-*`` (no marker) is removed.

Renames are atomic because every sibling shares ``<out>``'s parent folder (one file system). Folders
are told apart by the process id in their name: leftovers of a process still running on this host are
left alone. Nothing is flushed to disk: this protects against the process dying, not the machine.

``<out>`` is taken as spelled (made absolute, ``..`` folded, see :func:`output_path`): when it is a
symbolic link, the link is what gets replaced; the folder it points to is left as it was.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from cosmos_sana.checkpoint.layout import COMPLETE_MARKER, is_complete
from cosmos_sana.log import get_logger

logger = get_logger(__name__)

STAGING_TAG = ".staging-"
OLD_TAG = ".old-"


def _sibling(out: Path, tag: str) -> Path:
    return out.with_name(f"{out.name}{tag}{os.getpid()}-{secrets.token_hex(4)}")


def _leftovers(out: Path, tag: str) -> list[Path]:
    """``<out><tag><pid>-<token>`` folders of processes no longer running."""
    if not out.parent.is_dir():
        return []
    prefix = f"{out.name}{tag}"
    found = []
    for path in out.parent.iterdir():
        if not path.name.startswith(prefix):
            continue
        pid, sep, token = path.name[len(prefix):].partition("-")
        if pid.isdigit() and sep and token and not _running(int(pid)):
            found.append(path)
    return found


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process has none in flight when it recovers
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(folder: Path) -> None:
    """Unmark first, so an interrupted removal never leaves a marked but partial folder. A symbolic
    link (an ``<out>`` that was one) is removed alone: what it points to is not this export's."""
    if folder.is_symlink():
        folder.unlink()
        return
    (folder / COMPLETE_MARKER).unlink(missing_ok=True)
    shutil.rmtree(folder)


def output_path(out: str | Path) -> Path:
    """``out`` absolute, with ``.`` and ``..`` folded as written (links are not followed), so that it has a
    name and a parent to put its siblings in; the file-system root is refused."""
    path = Path(os.path.abspath(out))
    if not path.name:
        raise ValueError(f"--out {out}: the file-system root cannot be an export folder")
    return path


def _vacant(out: Path) -> bool:
    """``out`` is missing, or an empty folder (made since an export moved the previous one aside)."""
    if not os.path.lexists(out):
        return True
    return out.is_dir() and not out.is_symlink() and not any(out.iterdir())


def recover_output(out: str | Path) -> Path | None:
    """Undo what an interrupted export of ``out`` left: a previous export moved aside comes back
    to ``out`` (returned) when ``out`` is missing or empty, staging folders and old copies are
    removed. A complete copy is kept aside while ``out`` holds something that is not a complete export."""
    out = output_path(out)
    restored = None
    olds = _leftovers(out, OLD_TAG)
    complete = [p for p in olds if is_complete(p)]
    if complete and _vacant(out):
        restored = max(complete, key=lambda p: (p / COMPLETE_MARKER).stat().st_mtime)
        os.rename(restored, out)  # replaces an empty folder in the same step
        olds.remove(restored)
        logger.warning("restored the previous export %s from %s (an export was interrupted)", out, restored.name)
    elif complete and not is_complete(out):
        olds = [p for p in olds if p not in complete]
        logger.warning("kept %s aside: %s is not a complete export", ", ".join(p.name for p in complete), out)
    for path in olds + _leftovers(out, STAGING_TAG):
        logger.info("removing %s, left by an interrupted export", path)
        _remove(path)
    return out if restored is not None else None


def new_staging(out: Path) -> Path:
    staging = _sibling(out, STAGING_TAG)
    staging.mkdir(parents=True)
    return staging


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def swap_in(staging: Path, out: Path) -> None:
    """Make the complete folder ``staging`` the new ``out``; the previous ``out`` is deleted afterwards
    (a copy that cannot be deleted is named in a warning and left for the next export to remove)."""
    old = None
    if os.path.lexists(out):  # a dangling link is replaced too
        old = _sibling(out, OLD_TAG)
        os.rename(out, old)
    try:
        os.rename(staging, out)
    except BaseException:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        try:
            _remove(old)
        except OSError as exc:  # the new export is in place: not a failed export
            logger.warning("could not delete the previous export, moved to %s (%s)", old, exc)
