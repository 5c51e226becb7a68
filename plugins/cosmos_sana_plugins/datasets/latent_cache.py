"""On-disk cache of VAE latents and text embeddings for SFT.

A sample's key hashes its media file's content, its caption and a *tag* fixing everything
else the tensors depend on (model id, target size, resize mode, frame sampling, CHI). Entries
are safetensors files, written atomically, so several workers may share a cache folder.

The encoder is injected: ``encoder(pixels, prompts) -> {name: batch-first tensor}`` with
``pixels`` ``B×3×H×W`` (image) or ``B×3×T×H×W`` (video) in [-1, 1]; :func:`encode_batch`
runs it only on the samples the cache lacks. Items carry their entry's path, so whoever
encodes (the trainer) needs no handle on the dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from cosmos_sana_plugins.datasets.layouts import MediaSource

Encoder = Callable[[torch.Tensor, list[str]], Mapping[str, torch.Tensor]]

_hashes: dict[tuple[str, str | None, int, int], str] = {}


def content_hash(source: MediaSource) -> str:
    """sha256 of the media bytes, memoised per (path, member, size, mtime) for this process."""
    stamp = source.stamp()
    if stamp not in _hashes:
        _hashes[stamp] = hashlib.sha256(source.read_bytes()).hexdigest()
    return _hashes[stamp]


class LatentCache:
    """``root/<key[:2]>/<key>.safetensors``, one file per sample."""

    def __init__(self, root: str | Path, tag: Mapping[str, Any]):
        self.root = Path(root)
        self.tag = json.dumps(dict(tag), sort_keys=True)

    def entry(self, media_hash: str, caption: str) -> Path:
        """Where the tensors of this media content + caption live under this cache's tag."""
        payload = json.dumps({"tag": self.tag, "media": media_hash, "caption": caption}, sort_keys=True)
        key = hashlib.sha256(payload.encode("utf-8")).hexdigest()
        return self.root / key[:2] / f"{key}.safetensors"


def load_entry(path: str | Path) -> dict[str, torch.Tensor] | None:
    """The cached tensors, or None when the entry does not exist yet."""
    return load_file(str(path)) if os.path.isfile(path) else None


def store_entry(path: str | Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write atomically (temporary file + rename), so concurrent writers never expose half a file."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    os.close(handle)
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def encode_batch(items: Sequence[Mapping[str, Any]], encoder: Encoder) -> dict[str, torch.Tensor]:
    """Batch tensors for dataset items: cached ones as stored, the rest encoded (and stored).

    Items come from the media datasets: a cache hit carries ``"encoded"`` (name → tensor),
    a miss carries ``"pixels"`` and ``"cache_path"`` (None without a cache). Results are
    stacked in item order; when a cache is involved they are on the CPU (the trainer moves
    them), otherwise on the encoder's device.
    """
    missing = [i for i, item in enumerate(items) if "encoded" not in item]
    if len(missing) == len(items) and not any(item.get("cache_path") for item in items):
        return dict(encoder(torch.stack([item["pixels"] for item in items]), [item["prompt"] for item in items]))
    per_sample: list[Mapping[str, torch.Tensor] | None] = [item.get("encoded") for item in items]
    if missing:
        pixels = torch.stack([items[i]["pixels"] for i in missing])
        encoded = encoder(pixels, [items[i]["prompt"] for i in missing])
        for row, i in enumerate(missing):
            sample = {name: value[row].detach().cpu() for name, value in encoded.items()}
            if items[i].get("cache_path"):
                store_entry(items[i]["cache_path"], sample)
            per_sample[i] = sample
    names = list(per_sample[0])
    return {name: torch.stack([sample[name] for sample in per_sample]) for name in names}
