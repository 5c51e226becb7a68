"""Write a restored transformer as a pipeline folder, and the file names of every export format.

The LoRA, native and other tools' layouts are the model plugin's (:class:`~cosmos_sana.specs.ModelSpec`
``lora_writer``, ``native_writer``, ``lora_layouts``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError
from cosmos_sana.checkpoint.pipeline_folder import MODEL_INDEX, TRANSFORMER, component_names

PEFT_FOLDER = "peft_adapter"
LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
NATIVE_FILE = "sana_native.pth"  # the transformer in the model family's own key layout
#: weight files a pipeline component may also carry beside its default safetensors (not exported then)
NON_SAFETENSORS_WEIGHTS = frozenset({".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".onnx"})
#: PEFT's key prefix for a ``PeftModel`` wrapping the transformer.
PEFT_MODEL_PREFIX = "base_model.model."


def write_pipeline(transformer: torch.nn.Module, base: Path, out: Path, *, max_shard_size: str | int) -> None:
    """A full diffusers pipeline folder: ``transformer`` saved by diffusers (sharded safetensors of
    ``max_shard_size`` each, with an index json), ``model_index.json`` and every other component folder it
    names copied byte for byte from ``base`` (VAE, text encoder, tokenizer and scheduler keep their files and
    stored dtypes; nothing else in ``base`` is copied)."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(base / MODEL_INDEX, out / MODEL_INDEX)
    for name in component_names(base):
        if name != TRANSFORMER:
            copy_component(base / name, out / name)
    transformer.save_pretrained(str(out / TRANSFORMER), safe_serialization=True, max_shard_size=max_shard_size)


def copy_component(src: Path, dst: Path) -> None:
    """Every file of a component folder (symlinks followed, no permission bits carried over). Weights in a
    pickle or other framework's format, and their shard indexes, are left out when the folder holds
    default (non-variant) safetensors, which diffusers and transformers load first; a folder with only
    variant safetensors (``model.fp16.safetensors``) keeps them, as its default weights."""
    if not src.is_dir():
        raise CheckpointError(f"{src}: component folder named in {src.parent / MODEL_INDEX} is missing")
    files = sorted(p for p in src.rglob("*") if p.is_file())
    has_default_safetensors = any(_is_default_safetensors(p.name) for p in files)
    for path in files:
        if has_default_safetensors and _is_other_format_weight(path.name):
            continue
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _is_default_safetensors(name: str) -> bool:
    """``model.safetensors``, ``model-00001-of-00002.safetensors`` or their index; not ``model.fp16.safetensors``."""
    for suffix in (".safetensors.index.json", ".safetensors"):
        if name.endswith(suffix):
            return "." not in name[: -len(suffix)]
    return False


def _is_other_format_weight(name: str) -> bool:
    """A weight file in another format (``pytorch_model.bin``) or its shard index (``pytorch_model.bin.index.json``)."""
    return Path(name.removesuffix(".index.json")).suffix in NON_SAFETENSORS_WEIGHTS


def merge_lora(transformer: torch.nn.Module, adapter: str) -> torch.nn.Module:
    """Fold ``adapter`` into the base weights and drop every PEFT layer (other adapters are discarded)."""
    transformer.fuse_lora(adapter_names=[adapter])
    transformer.unload_lora()
    return transformer
