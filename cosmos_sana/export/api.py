"""Export a DCP checkpoint to what stock diffusers / PEFT / native SANA tools load.

Formats:

* ``diffusers`` — full pipeline folder (sharded safetensors + index json);
* ``lora``      — ``pytorch_lora_weights.safetensors`` + ``peft_adapter/``;
* ``merged``    — the LoRA folded into the base weights, as a full pipeline folder;
* ``native``    — ``sana_native.pth`` in native SANA key layout (LoRA merged first).

The output folder is built beside the target, verified when asked, given an
``export_manifest.json`` and a ``COMPLETE`` marker, then renamed into place.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError, rank_local
from cosmos_sana.checkpoint.layout import STAGING_PREFIX, publish, remove_checkpoint, write_marker
from cosmos_sana.checkpoint.pipeline_folder import TRANSFORMER, stored_dtype
from cosmos_sana.checkpoint.training import package_versions
from cosmos_sana.export.restore import ExportSource, open_source, restore_transformer
from cosmos_sana.export.verify import VerifyOptions, verify_export
from cosmos_sana.export.writers import merge_lora, write_lora, write_native, write_pipeline
from cosmos_sana.log import get_logger
from cosmos_sana.redaction import redact

logger = get_logger(__name__)

FORMATS = ("auto", "diffusers", "lora", "merged", "native")
MANIFEST_FILE = "export_manifest.json"
DEFAULT_SHARD = "5GB"


def resolve_format(fmt: str, source: ExportSource) -> str:
    """``auto``: ``lora`` for LoRA checkpoints, ``diffusers`` otherwise; rejects impossible pairs."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "auto":
        return "lora" if source.is_lora else "diffusers"
    if fmt in ("lora", "merged") and not source.is_lora:
        raise CheckpointError(f"{source.path}: holds full weights, not a LoRA; use --format diffusers or native")
    if fmt == "diffusers" and source.is_lora:
        raise CheckpointError(f"{source.path}: holds LoRA adapters; use --format lora or merged")
    return fmt


def pick_adapter(source: ExportSource, adapter: str | None) -> str:
    adapters = source.model.get("adapters", {})
    if adapter is None:
        trainable = source.model.get("trainable_adapters") or list(adapters)
        adapter = trainable[0]
    if adapter not in adapters:
        raise CheckpointError(f"{source.path}: no adapter {adapter!r} (has {sorted(adapters)})")
    return adapter


def clear_output(out: Path) -> None:
    """Remove a previous export (or an empty folder); refuse to delete anything else."""
    if not out.exists():
        return
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
        return
    if not (out / MANIFEST_FILE).is_file():
        raise CheckpointError(f"--out {out}: exists and is not a cosmos-sana export (no {MANIFEST_FILE}); refusing to delete it")
    remove_checkpoint(out)


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    fmt: str = "auto",
    ema: bool = False,
    base: str | Path | None = None,
    adapter: str | None = None,
    dtype: torch.dtype | None = None,
    max_shard_size: str | int = DEFAULT_SHARD,
    verify: VerifyOptions | None = None,
) -> Path:
    """Export ``checkpoint`` to ``out`` in ``fmt``; returns ``out``. ``verify`` generates once first.

    Runs in this process alone, also on one rank of a distributed job."""
    with rank_local():
        return _export(checkpoint, out, fmt=fmt, ema=ema, base=base, adapter=adapter, dtype=dtype,
                       max_shard_size=max_shard_size, verify=verify)


def _export(
    checkpoint: str | Path,
    out: str | Path,
    *,
    fmt: str,
    ema: bool,
    base: str | Path | None,
    adapter: str | None,
    dtype: torch.dtype | None,
    max_shard_size: str | int,
    verify: VerifyOptions | None,
) -> Path:
    source = open_source(checkpoint, base)
    fmt = resolve_format(fmt, source)
    out = Path(out)
    clear_output(out)
    staging = out.with_name(f"{STAGING_PREFIX}{out.name}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        manifest = _write(source, staging, fmt=fmt, ema=ema, adapter=adapter, dtype=dtype, max_shard_size=max_shard_size)
        if verify is not None:
            manifest["verified"] = verify_export(staging, fmt, source.base_pipeline, verify)
        manifest = {**redact(manifest), "files": _files(staging)}  # file names are not secrets ("tokenizer/…")
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        write_marker(staging, format=fmt)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    publish(staging, out)
    logger.info("exported %s (%s, step %d) to %s", source.path, fmt, source.step, out)
    return out


def _write(
    source: ExportSource, staging: Path, *, fmt: str, ema: bool, adapter: str | None, dtype: torch.dtype | None,
    max_shard_size: str | int,
) -> dict[str, Any]:
    chosen = pick_adapter(source, adapter) if source.is_lora else None
    merging = chosen is not None and fmt != "lora"
    # a LoRA is folded in at fp32, then the result takes the requested (or the base's) dtype
    transformer = restore_transformer(source, ema=ema, dtype=torch.float32 if merging else dtype)
    if merging:
        transformer = merge_lora(transformer, chosen)
        transformer.to(dtype or stored_dtype(source.base_pipeline / TRANSFORMER))
    if fmt == "lora":
        write_lora(transformer, chosen, staging)
    elif fmt == "native":
        write_native(transformer, staging)
    else:
        write_pipeline(transformer, source.base_pipeline, staging, max_shard_size=max_shard_size)
    return {
        "format": fmt,
        "source_checkpoint": str(source.path.resolve()),
        "source_kind": source.meta["kind"],
        "step": source.step,
        "base_pipeline": str(source.base_pipeline.resolve()),
        "pipeline_class": source.pipeline_class,
        "ema": ema,
        "adapter": chosen,
        "config_sha256": source.meta["config_sha256"],
        "versions": package_versions(),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
