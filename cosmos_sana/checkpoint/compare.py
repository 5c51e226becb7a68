"""Compare two training checkpoints entry by entry, without building a model.

Every DCP part (``model``, ``optim``, ``ema``, ``rng``, ``trainer``, ``scheduler``…) is read
as it is stored. Entries are grouped by part, and LoRA entries further by adapter
(``model/lora_default``, ``model/lora_old``, ``optim/lora_default``…); per group the report
gives the largest absolute difference and whether every entry is bit-identical. ``meta.json``
and the run config are not compared (they hold times and the run's own folder).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from cosmos_sana.checkpoint.dcp_io import METADATA_FILE, CheckpointError, load_state, read_metadata
from cosmos_sana.checkpoint.layout import resolve_resume

#: PEFT LoRA entries name their adapter after the weight kind: ``….lora_A.<adapter>.weight``
ADAPTER_IN_KEY = re.compile(r"\.lora_(?:A|B|embedding_A|embedding_B|magnitude_vector)\.([^.]+)\.")


def read_part(folder: str | Path) -> dict[str, Any]:
    """Every entry of one DCP folder under its flattened key (``a.b.c``)."""
    metadata = read_metadata(folder)
    state: dict[str, Any] = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype) if isinstance(meta, TensorStorageMetadata) else None
        for key, meta in metadata.state_dict_metadata.items()
    }
    load_state(state, folder)
    return state


def read_checkpoint(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{part: entries}`` of every DCP part in a checkpoint folder."""
    path = Path(path)
    parts = {p.name: read_part(p) for p in sorted(path.iterdir()) if (p / METADATA_FILE).is_file()}
    if not parts:
        raise CheckpointError(f"{path}: no DCP parts (not a training checkpoint folder)")
    return parts


def group_of(part: str, key: str) -> str:
    match = ADAPTER_IN_KEY.search(key)
    return f"{part}/lora_{match.group(1)}" if match else part


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def _abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a − b| (NaN where either holds NaN at a position the other does not); inf for shapes that differ."""
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def compare_checkpoints(a: str | Path, b: str | Path) -> dict[str, Any]:
    """The comparison report of checkpoints ``a`` and ``b`` (folders ``iter_<step>``, or run
    folders: their latest complete checkpoint)."""
    paths = [resolve_resume(str(p), p) for p in (a, b)]
    left, right = (read_checkpoint(p) for p in paths)
    groups: dict[str, dict[str, Any]] = {}
    only: dict[str, list[str]] = {"a": [], "b": []}
    for part in sorted(set(left) | set(right)):
        keys_a, keys_b = left.get(part, {}), right.get(part, {})
        only["a"] += [f"{part}/{k}" for k in sorted(set(keys_a) - set(keys_b))]
        only["b"] += [f"{part}/{k}" for k in sorted(set(keys_b) - set(keys_a))]
        for key in sorted(set(keys_a) & set(keys_b)):
            va, vb = keys_a[key], keys_b[key]
            group = groups.setdefault(
                group_of(part, key), {"entries": 0, "differing": 0, "max_abs_diff": 0.0, "bit_identical": True}
            )
            group["entries"] += 1
            if isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor):
                same, diff = _same_bits(va, vb), _abs_diff(va, vb)
            else:
                same = va == vb
                diff = 0.0 if same else float("inf")  # unequal plain values (or shapes): not comparable
            if not same:
                group["differing"] += 1
                group["bit_identical"] = False
            group["max_abs_diff"] = max(group["max_abs_diff"], diff)
    return {
        "a": str(paths[0]),
        "b": str(paths[1]),
        "bit_identical": not only["a"] and not only["b"] and all(g["bit_identical"] for g in groups.values()),
        "groups": groups,
        "only_in_a": only["a"],
        "only_in_b": only["b"],
    }
