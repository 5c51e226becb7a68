"""Rebuild the transformer a DCP checkpoint describes (training or ``convert-to-dcp`` output)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError, load_state, stored_keys
from cosmos_sana.checkpoint.layout import COMPLETE_MARKER, ITER_PATTERN, find_latest, is_complete
from cosmos_sana.checkpoint.pipeline_folder import is_pipeline_folder, pipeline_class_name, transformer_class
from cosmos_sana.checkpoint.states import MODEL_CONFIG_FILE, ModelState
from cosmos_sana.checkpoint.training import EMA_PART, MODEL_PART, load_checkpoint, read_meta
from cosmos_sana.export.base import BaseWeights, recorded_base, stored_dcp_dtype


@dataclass(frozen=True)
class ExportSource:
    """A complete checkpoint folder, what its ``meta.json`` says about the model, and the base its run trained on."""

    path: Path
    meta: dict[str, Any]
    base: BaseWeights

    @property
    def base_pipeline(self) -> Path:
        return self.base.pipeline

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def model(self) -> dict[str, Any]:
        return self.meta["parts"][MODEL_PART]

    @property
    def is_lora(self) -> bool:
        return bool(self.model.get("lora_only"))

    @property
    def pipeline_class(self) -> str:
        return pipeline_class_name(self.base_pipeline)

    @property
    def has_ema(self) -> bool:
        return EMA_PART in self.meta["parts"]


def open_source(
    checkpoint: str | Path,
    base: str | Path | None = None,
    *,
    native_checkpoint: str | None = None,
    init_from: str | Path | None = None,
) -> ExportSource:
    """A checkpoint folder, or a training output dir (its latest complete checkpoint).

    ``base`` (the pipeline folder supplying VAE, text encoder, tokenizer, scheduler and the
    transformer's architecture) defaults to the one recorded at save time; a native checkpoint
    or ``init_from`` folder the run started from is read from its ``run_config.json``;
    ``native_checkpoint`` / ``init_from`` say where those files are now (a run moved elsewhere).
    """
    path = Path(checkpoint)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist")
    if not (path / COMPLETE_MARKER).exists() and not ITER_PATTERN.match(path.name):
        latest = find_latest(path)
        if latest is None:
            raise CheckpointError(f"{path}: no complete checkpoint in it or under {path}/checkpoints")
        path = latest
    if not is_complete(path):
        raise CheckpointError(f"{path}: no {COMPLETE_MARKER} marker (partially written checkpoint)")
    meta = read_meta(path)
    if MODEL_PART not in meta["parts"]:
        raise CheckpointError(f"{path}: has no '{MODEL_PART}' part to export (parts: {sorted(meta['parts'])})")
    recorded = meta["parts"][MODEL_PART].get("base_pipeline")
    chosen = base if base is not None else recorded
    if chosen is None:
        raise CheckpointError(f"{path}: no base pipeline recorded; pass --base PIPELINE_DIR")
    if not is_pipeline_folder(chosen):
        origin = "--base" if base is not None else f"base pipeline recorded in {path}/meta.json"
        raise CheckpointError(f"{origin} {chosen}: not a diffusers pipeline folder (no model_index.json); pass --base")
    trained_on = recorded_base(path, Path(chosen)).relocated(native_checkpoint=native_checkpoint, init_from=init_from)
    return ExportSource(path=path, meta=meta, base=trained_on)


def _uninitialised(cls: type, config: dict[str, Any], dtype: torch.dtype) -> torch.nn.Module:
    """``cls.from_config(config)`` on CPU in ``dtype`` without its random initialisation (for 1.6B
    parameters that costs more than the rest of an export), for weights loaded next. A class with
    non-persistent buffers (computed at construction, never stored) is built the ordinary way."""
    with torch.device("meta"):
        model = cls.from_config(config)
    if any(module._non_persistent_buffers_set for module in model.modules()):
        return cls.from_config(config).to(dtype)
    return model.to(dtype).to_empty(device="cpu")


def restore_transformer(source: ExportSource, *, ema: bool = False, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The checkpoint's transformer on CPU; LoRA checkpoints get their adapters on the base weights
    the run trained on (``source.base``).

    ``ema`` swaps the EMA part's tensors in for the trained ones they average.
    """
    from peft import LoraConfig

    if source.is_lora:
        transformer = source.base.build()
        if dtype is not None:
            transformer.to(dtype)
        for name, config in source.model["adapters"].items():
            transformer.add_adapter(LoraConfig.from_peft_type(**config), adapter_name=name)
        load_checkpoint(source.path, {MODEL_PART: ModelState(transformer, lora_only=True)})
    else:
        config = json.loads((source.path / MODEL_CONFIG_FILE).read_text(encoding="utf-8"))
        transformer = _uninitialised(transformer_class(source.base_pipeline), config,
                                     dtype or stored_dcp_dtype(source.path / MODEL_PART))
        load_checkpoint(source.path, {MODEL_PART: ModelState(transformer)})  # every weight, or an error
    if ema:
        swap_in_ema(transformer, source)
    return transformer.eval()


def swap_in_ema(transformer: torch.nn.Module, source: ExportSource) -> None:
    """Overwrite the averaged parameters with their EMA values (keys: parameter FQNs)."""
    if not source.has_ema:
        raise CheckpointError(f"{source.path}: has no '{EMA_PART}' part (was EMA enabled in training?)")
    params = dict(transformer.named_parameters())
    keys = stored_keys(source.path / EMA_PART)
    unknown = sorted(keys - params.keys())
    if unknown:
        raise CheckpointError(f"{source.path}/{EMA_PART}: keys not in {type(transformer).__name__}: {unknown[:5]}")
    with torch.no_grad():
        load_state({k: params[k].data for k in keys}, source.path / EMA_PART)
