"""SANA's side of ``cosmos-sana export`` and ``convert-to-dcp`` (the :class:`~cosmos_sana.specs.ModelSpec` tools).

The export framework (:mod:`cosmos_sana.export`) restores the transformer, merges and checks it, and
calls these to write the formats whose layout is SANA's: the diffusers LoRA file with its PEFT
adapter folder, and the native ``.pth``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError
from cosmos_sana.checkpoint.pipeline_folder import model_index
from cosmos_sana.export.writers import NATIVE_FILE, PEFT_FOLDER, PEFT_MODEL_PREFIX
from cosmos_sana.local_paths import WAN_VAE_CLASS
from cosmos_sana_plugins.sana.native_keys import VIDEO_CLASS


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


def write_native(transformer: torch.nn.Module, out: Path, *, layout_of: str | None = None) -> Path:
    """A native SANA ``.pth`` (``{"state_dict": …}``, native key layout; with ``layout_of``, the FFN
    layout of that native checkpoint: a run started from a LinearFFN checkpoint exports LinearFFN)."""
    from cosmos_sana_plugins.sana.native_checkpoint import save_native

    return save_native(transformer, out / NATIVE_FILE, layout_of=layout_of)


def check_components(pipeline: str | Path, transformer: torch.nn.Module) -> None:
    """The pipeline must hold the VAE the transformer's latents need (SANA-Video: the Wan VAE)."""
    index = model_index(pipeline)
    if type(transformer).__name__ == VIDEO_CLASS:
        vae = index.get("vae") or [None, None]
        if vae[1] != WAN_VAE_CLASS or not (Path(pipeline) / "vae").is_dir():
            raise CheckpointError(
                f"--base {pipeline}: a SANA-Video checkpoint needs the Wan VAE ({WAN_VAE_CLASS} in vae/), "
                f"found {vae[1]!r}; pass a SanaVideoPipeline folder"
            )
