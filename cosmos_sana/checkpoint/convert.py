"""Hugging Face / native SANA weights → a DCP folder that training starts from.

Output (cosmos-framework layout)::

    <out>/model/        DCP, data files of about ``chunk_size`` each
    <out>/config.json   the transformer's diffusers config
    <out>/meta.json     kind "converted", step 0, base pipeline, source
    <out>/COMPLETE      written last
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from cosmos_sana.checkpoint.dcp_io import CheckpointError, load_state, non_finite_entry, save_state
from cosmos_sana.checkpoint.layout import STAGING_PREFIX, publish, write_marker
from cosmos_sana.checkpoint.pipeline_folder import is_pipeline_folder, load_transformer, pipeline_class_name
from cosmos_sana.checkpoint.states import ModelState, base_key, is_lora_key
from cosmos_sana.checkpoint.training import META_FILE, MODEL_PART, write_meta
from cosmos_sana.config.checkpoint import parse_size
from cosmos_sana.log import get_logger

logger = get_logger(__name__)

DEFAULT_CHUNK = "5GB"


def load_source_transformer(
    source: str, *, base: str | Path | None = None, dtype: torch.dtype | None = None, native_use_ema: bool = False
) -> tuple[torch.nn.Module, Path]:
    """``(transformer, base pipeline folder)`` from a pipeline folder or a native SANA checkpoint.

    A native checkpoint (``.pth``, ``.safetensors``, ``.index.json``, ``hf://…``) needs
    ``base``: the pipeline folder whose config, VAE and text encoder it belongs with. The model plugin
    serving ``base``'s pipeline class reads it (``ModelSpec.native_loader``) and checks ``base`` holds
    what it needs (``ModelSpec.pipeline_check``).
    """
    if is_pipeline_folder(source):
        return load_transformer(source, dtype), Path(source).resolve()
    if base is None:
        raise CheckpointError(
            f"{source}: not a diffusers pipeline folder (no model_index.json); for a native SANA "
            "checkpoint pass --base PIPELINE_DIR (the pipeline whose VAE/text encoder it pairs with)"
        )
    if not is_pipeline_folder(base):
        raise CheckpointError(f"--base {base}: not a diffusers pipeline folder (no model_index.json)")
    from cosmos_sana.model_hooks import model_spec_for, model_tool
    from cosmos_sana.specs import resolve

    pipeline_class = pipeline_class_name(base)
    load_native = model_tool(pipeline_class, "native_loader")
    transformer = load_native(source, base_config=str(base), use_ema=native_use_ema, torch_dtype=dtype)
    check = model_spec_for(pipeline_class).pipeline_check
    if check is not None:
        resolve(check)(base, transformer)
    return transformer.eval(), Path(base).resolve()


def _check_replaceable(out: Path) -> None:
    if out.exists() and any(out.iterdir()) and not (out / META_FILE).is_file():
        raise CheckpointError(f"{out}: exists and is not a cosmos-sana checkpoint folder; refusing to replace it")


def convert_to_dcp(
    source: str,
    out: str | Path,
    *,
    base: str | Path | None = None,
    chunk_size: str | int = DEFAULT_CHUNK,
    dtype: torch.dtype | None = None,
    native_use_ema: bool = False,
) -> Path:
    """Write the transformer of ``source`` as DCP under ``<out>/model`` (CPU, single process)."""
    out = Path(out)
    _check_replaceable(out)
    logger.info("convert-to-dcp: reading the transformer of %s", source)
    transformer, base_pipeline = load_source_transformer(source, base=base, dtype=dtype, native_use_ema=native_use_ema)
    staging = out.with_name(f"{STAGING_PREFIX}{out.name}")
    shutil.rmtree(staging, ignore_errors=True)
    state = get_model_state_dict(transformer)
    size = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    logger.info("convert-to-dcp: %d tensors, %.2f GB; checking every weight is finite", len(state), size / 1e9)
    key = non_finite_entry(state)
    if key is not None:
        raise CheckpointError(f"{source}: weight {key!r} holds NaN or inf; not converted")
    staging.mkdir(parents=True)
    logger.info("convert-to-dcp: writing DCP to %s (files of about %s)", out / MODEL_PART, chunk_size)
    save_state(state, staging / MODEL_PART, chunk_bytes=parse_size(chunk_size))
    parts = {MODEL_PART: ModelState(transformer, base_pipeline=str(base_pipeline))}
    write_meta(staging, kind="converted", step=0, parts=parts, config={"source": str(source)})
    publish(staging, out)
    write_marker(out, step=0, source=str(source))
    files = sorted(p.name for p in (out / MODEL_PART).glob("*.distcp"))
    logger.info("wrote %s (%d data files)", out / MODEL_PART, len(files))
    return out


def load_model_weights(folder: str | Path, module: torch.nn.Module) -> None:
    """Initialise ``module``'s base weights from a DCP model (``convert-to-dcp`` output or checkpoint).

    ``module`` may already carry PEFT adapters: its wrapped ``…base_layer…`` weights are
    filled from the plain keys, its LoRA tensors are left as they are.
    """
    folder = Path(folder)
    model_dir = folder / MODEL_PART if (folder / MODEL_PART).is_dir() else folder
    if (folder / META_FILE).is_file():
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        if meta.get("parts", {}).get(MODEL_PART, {}).get("lora_only"):
            raise CheckpointError(f"{folder}: holds LoRA adapters only, not base weights to initialise from")
    current = get_model_state_dict(module)
    plain_to_key = {base_key(k): k for k in current if not is_lora_key(k)}
    template = {plain: current[key] for plain, key in plain_to_key.items()}
    load_state(template, model_dir)
    set_model_state_dict(
        module, {plain_to_key[p]: v for p, v in template.items()}, options=StateDictOptions(strict=False)
    )
