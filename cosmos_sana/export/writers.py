"""Write a restored transformer in each export format."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from cosmos_sana.checkpoint.pipeline_folder import TRANSFORMER

PEFT_FOLDER = "peft_adapter"
LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
NATIVE_FILE = "sana_native.pth"
#: PEFT's key prefix for a ``PeftModel`` wrapping the transformer.
PEFT_MODEL_PREFIX = "base_model.model."


def write_pipeline(transformer: torch.nn.Module, base: Path, out: Path, *, max_shard_size: str | int) -> None:
    """A full diffusers pipeline folder: ``transformer`` saved by diffusers (sharded safetensors of
    ``max_shard_size`` each, with an index json) and every other entry of ``base`` copied byte for byte,
    so the VAE, text encoder, tokenizer and scheduler keep their files and stored dtypes. Hidden
    top-level entries (``.cache``, ``.git``) are left out."""
    out.mkdir(parents=True, exist_ok=True)
    for entry in sorted(base.iterdir()):
        if entry.name == TRANSFORMER or entry.name.startswith("."):
            continue
        if entry.is_dir():
            shutil.copytree(entry, out / entry.name)
        else:
            shutil.copy2(entry, out / entry.name)
    transformer.save_pretrained(str(out / TRANSFORMER), safe_serialization=True, max_shard_size=max_shard_size)


def write_lora(transformer: torch.nn.Module, adapter: str, out: Path) -> None:
    """``pytorch_lora_weights.safetensors`` (keys ``transformer.…``, loads with ``pipe.load_lora_weights``)
    and a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``)."""
    from peft.utils import SAFETENSORS_WEIGHTS_NAME
    from safetensors.torch import save_file

    from cosmos_sana_plugins.sana.lora import adapter_export, save_diffusers_lora

    save_diffusers_lora(transformer, adapter, out)
    state, _ = adapter_export(transformer, adapter)
    peft_dir = out / PEFT_FOLDER
    peft_dir.mkdir()
    transformer.peft_config[adapter].save_pretrained(str(peft_dir))  # adapter_config.json
    save_file(
        {f"{PEFT_MODEL_PREFIX}{k}": v.contiguous() for k, v in state.items()},
        str(peft_dir / SAFETENSORS_WEIGHTS_NAME),
        metadata={"format": "pt"},
    )


def merge_lora(transformer: torch.nn.Module, adapter: str) -> torch.nn.Module:
    """Fold ``adapter`` into the base weights and drop every PEFT layer (other adapters are discarded)."""
    transformer.fuse_lora(adapter_names=[adapter])
    transformer.unload_lora()
    return transformer


def write_native(transformer: torch.nn.Module, out: Path) -> Path:
    """A native SANA ``.pth`` (``{"state_dict": …}``, native key layout)."""
    from cosmos_sana_plugins.sana.native_checkpoint import save_native

    return save_native(transformer, out / NATIVE_FILE)

