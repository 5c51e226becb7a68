"""Write a restored transformer in each export format."""

from __future__ import annotations

from pathlib import Path

import torch

PEFT_FOLDER = "peft_adapter"
LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
NATIVE_FILE = "sana_native.pth"
#: PEFT's key prefix for a ``PeftModel`` wrapping the transformer.
PEFT_MODEL_PREFIX = "base_model.model."


def write_pipeline(transformer: torch.nn.Module, base: Path, out: Path, *, max_shard_size: str | int) -> None:
    """A full diffusers pipeline folder: ``transformer`` plus every other component of ``base``.

    Sharded safetensors (``max_shard_size`` each) with an index json, as ``save_pretrained`` writes them.
    """
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(base), transformer=transformer)
    pipe.save_pretrained(str(out), safe_serialization=True, max_shard_size=max_shard_size)


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

