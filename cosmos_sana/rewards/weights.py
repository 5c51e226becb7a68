"""Find a scorer's weights: a local path, or a Hugging Face hub id (offline mode respected).

A folder is ``org/repo`` (or a local folder); a single file is ``org/repo/path/in/repo``
(or a local file). When weights are missing the error says what to download and
which ``args`` key to point at a local copy instead.
"""

from __future__ import annotations

import os
from typing import Any, Callable


class WeightsMissingError(FileNotFoundError):
    """A scorer's weights are neither on disk nor obtainable from the hub."""


def _hint(reward: str, key: str, ref: str, download: str, cause: BaseException) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    return (
        f"reward {reward!r}: cannot load args.{key} = {ref!r} ({type(cause).__name__}: {cause})"
        + ("; HF_HUB_OFFLINE is set" if offline else "")
        + f". Download it where there is internet with `{download}` (and copy the HF cache here), "
        f"or set [[custom.rewards]] args.{key} to a local path."
    )


def resolve_file(ref: str, *, reward: str, key: str) -> str:
    """A local file path for ``ref`` (a path, or ``org/repo/file`` fetched through the HF cache)."""
    local = os.path.expanduser(ref)
    if os.path.isfile(local):
        return local
    parts = ref.split("/")
    if os.path.exists(local) or len(parts) < 3 or ref.startswith((".", "/", "~")):
        raise WeightsMissingError(
            f"reward {reward!r}: args.{key} = {ref!r} is not a file; give a local file or 'org/repo/file' on the hub"
        )
    from huggingface_hub import hf_hub_download

    repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        return hf_hub_download(repo_id=repo_id, filename=filename)
    except Exception as exc:
        raise WeightsMissingError(
            _hint(reward, key, ref, f"huggingface-cli download {repo_id} {filename}", exc)
        ) from exc


def from_pretrained(loader: Callable[..., Any], ref: str, *, reward: str, key: str, **kwargs: Any) -> Any:
    """``loader(ref, **kwargs)`` (a ``from_pretrained``), with a download hint when it cannot find ``ref``."""
    if ref.startswith((".", "/", "~")) and not os.path.isdir(os.path.expanduser(ref)):
        raise WeightsMissingError(f"reward {reward!r}: args.{key} = {ref!r} is not a folder")
    try:
        return loader(os.path.expanduser(ref), **kwargs)
    except OSError as exc:
        raise WeightsMissingError(_hint(reward, key, ref, f"huggingface-cli download {ref}", exc)) from exc
