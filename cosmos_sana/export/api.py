"""Export a DCP checkpoint to what stock diffusers / PEFT / native SANA tools load.

Formats:

* ``diffusers`` — full pipeline folder (sharded safetensors + index json);
* ``lora``      — ``pytorch_lora_weights.safetensors`` + ``peft_adapter/`` (written by the model plugin);
* ``merged``    — the LoRA folded into the base weights, as a full pipeline folder;
* ``native``    — ``sana_native.pth`` in native SANA key layout (LoRA merged first; written by the model plugin);
* ``comfyui``   — the LoRA in the layout ComfyUI's LoRA loader reads (written by the model plugin).

Every export carries a model card (``README.md``, :mod:`.model_card`).

LoRA checkpoints are merged onto (and verified and described with) the base the run trained on:
the pipeline's transformer, a native SANA checkpoint or an ``init_from`` folder (:mod:`.base`).
Every exported tensor must be finite. The output folder is built beside the target, verified when
asked, given an ``export_manifest.json`` and a ``COMPLETE`` marker, then swapped into place so that
a previous export survives any failure (:mod:`.swap`). ``--out`` may not overlap anything it reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError, rank_local
from cosmos_sana.checkpoint.layout import write_marker
from cosmos_sana.checkpoint.states import is_lora_key
from cosmos_sana.checkpoint.training import package_versions
from cosmos_sana.export.model_card import write_model_card
from cosmos_sana.export.restore import ExportSource, open_source, restore_transformer
from cosmos_sana.export.swap import discard, new_staging, output_path, recover_output, swap_in
from cosmos_sana.export.verify import VerifyOptions, verify_export
from cosmos_sana.export.writers import merge_lora, write_pipeline
from cosmos_sana.log import get_logger
from cosmos_sana.model_hooks import lora_layout_writer, model_tool
from cosmos_sana.redaction import redact

logger = get_logger(__name__)

FORMATS = ("auto", "diffusers", "lora", "merged", "native", "comfyui")
#: formats that hold the LoRA alone (not merged into the base)
LORA_FORMATS = ("lora", "comfyui")
MANIFEST_FILE = "export_manifest.json"
DEFAULT_SHARD = "5GB"


def resolve_format(fmt: str, source: ExportSource) -> str:
    """``auto``: ``lora`` for LoRA checkpoints, ``diffusers`` otherwise; rejects impossible pairs."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "auto":
        return "lora" if source.is_lora else "diffusers"
    if fmt in ("merged", *LORA_FORMATS) and not source.is_lora:
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


class NonFiniteWeights(CheckpointError):
    """A tensor to be exported holds NaN or inf."""


def check_out_path(out: Path, checkpoint: Path, source: ExportSource) -> None:
    """Refuse an ``out`` equal to, inside or containing the checkpoint or anything the base reads
    (replacing ``out`` would delete them); a training output dir given as ``checkpoint`` may hold ``out``."""
    target = out.resolve()
    protected = [("the checkpoint", source.path, True), ("the base", source.base_pipeline, True)]
    protected += [("the base weights", path, True) for path in source.base.weight_paths]
    protected.append(("the checkpoint argument", checkpoint, False))
    for label, path, refuse_inside in protected:
        resolved = path.resolve()
        if target == resolved:
            relation = "is"
        elif resolved in target.parents and refuse_inside:
            relation = "is inside"
        elif target in resolved.parents:
            relation = "contains"
        else:
            continue
        raise CheckpointError(f"--out {out}: {relation} {label} {path}; choose a folder outside it")


def check_replaceable(out: Path) -> None:
    """``out`` may be missing, empty or a previous export; anything else is refused."""
    if not out.exists():
        return
    if not out.is_dir():
        raise CheckpointError(f"--out {out}: exists and is not a folder; refusing to replace it")
    if any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise CheckpointError(f"--out {out}: exists and is not a cosmos-sana export (no {MANIFEST_FILE}); refusing to delete it")


def check_finite(tensors: Iterable[tuple[str, torch.Tensor]], what: str, source: ExportSource) -> None:
    """Raise :class:`NonFiniteWeights` naming the first tensor with a NaN or inf."""
    for key, value in tensors:
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise NonFiniteWeights(
                f"{source.path}: {what} {key!r} has {bad} NaN/inf values of {value.numel()}; nothing exported"
            )


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
    native_checkpoint: str | None = None,
    init_from: str | Path | None = None,
) -> Path:
    """Export ``checkpoint`` to ``out`` in ``fmt``; returns ``out``. ``verify`` generates once first.
    ``native_checkpoint`` / ``init_from``: where the base weights its run recorded are now.

    Runs in this process alone, also on one rank of a distributed job."""
    with rank_local():
        return _export(checkpoint, out, fmt=fmt, ema=ema, base=base, adapter=adapter, dtype=dtype,
                       max_shard_size=max_shard_size, verify=verify, native_checkpoint=native_checkpoint,
                       init_from=init_from)


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
    native_checkpoint: str | None,
    init_from: str | Path | None,
) -> Path:
    source = open_source(checkpoint, base, native_checkpoint=native_checkpoint, init_from=init_from)
    fmt = resolve_format(fmt, source)
    if verify is not None and fmt not in ("diffusers", "merged", "lora", "native"):
        raise ValueError(f"--verify loads the export with diffusers, which does not read the {fmt} layout")
    out = output_path(out)
    check_out_path(out, Path(checkpoint), source)
    recover_output(out)
    check_replaceable(out)
    staging = new_staging(out)
    try:
        manifest = _write(source, staging, fmt=fmt, ema=ema, adapter=adapter, dtype=dtype, max_shard_size=max_shard_size)
        write_model_card(staging, manifest, source)
        if verify is not None:
            manifest["verified"] = verify_export(staging, fmt, source.base_pipeline, verify,
                                                 base_transformer=source.base.build)
        manifest = {**redact(manifest), "files": _files(staging)}  # file names are not secrets ("tokenizer/…")
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        write_marker(staging, format=fmt)
        swap_in(staging, out)
    except BaseException:
        discard(staging)
        raise
    logger.info("exported %s (%s, step %d) to %s", source.path, fmt, source.step, out)
    return out


def _write(
    source: ExportSource, staging: Path, *, fmt: str, ema: bool, adapter: str | None, dtype: torch.dtype | None,
    max_shard_size: str | int,
) -> dict[str, Any]:
    chosen = pick_adapter(source, adapter) if source.is_lora else None
    merging = chosen is not None and fmt not in LORA_FORMATS
    # a LoRA is folded in at fp32, then the result takes the requested (or the base's stored) dtype
    transformer = restore_transformer(source, ema=ema, dtype=None if merging else dtype)
    if chosen is not None:
        adapter_tensors = ((k, v) for k, v in transformer.state_dict().items() if is_lora_key(k) and f".{chosen}." in k)
        check_finite(adapter_tensors, f"LoRA weight of adapter {chosen!r}", source)
    if merging:
        base_dtype = next(p.dtype for k, p in transformer.named_parameters() if not is_lora_key(k))
        transformer = merge_lora(transformer.to(torch.float32), chosen)
        transformer.to(dtype or base_dtype)
    if fmt not in LORA_FORMATS:
        check_finite(transformer.state_dict().items(), "merged weight" if merging else "weight", source)
    if fmt == "lora":
        model_tool(source.pipeline_class, "lora_writer")(transformer, chosen, staging)
    elif fmt in LORA_FORMATS:
        lora_layout_writer(source.pipeline_class, fmt)(transformer, chosen, staging, pipeline_class=source.pipeline_class)
    elif fmt == "native":
        model_tool(source.pipeline_class, "native_writer")(transformer, staging, layout_of=source.base.native_checkpoint)
    else:
        write_pipeline(transformer, source.base_pipeline, staging, max_shard_size=max_shard_size)
    return {
        "format": fmt,
        "source_checkpoint": str(source.path.resolve()),
        "source_kind": source.meta["kind"],
        "step": source.step,
        "base_pipeline": str(source.base_pipeline.resolve()),
        "base": source.base.describe(),
        "pipeline_class": source.pipeline_class,
        "ema": ema,
        "adapter": chosen,
        "config_sha256": source.meta["config_sha256"],
        "versions": package_versions(),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
