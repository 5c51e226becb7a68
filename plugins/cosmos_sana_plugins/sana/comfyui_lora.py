"""A SANA LoRA in the layout ComfyUI's LoRA loader applies to the SANA model of the ExtraModels custom node.

Which loader reads it, and what it reads (checked against the loaders' code, 2026-12):

* ComfyUI's core has no SANA model (native support is still an open request: Comfy-Org/ComfyUI, formerly
  comfyanonymous/ComfyUI, issues #5785 and #6136). ComfyUI users run SANA with the ``city96/ComfyUI_ExtraModels`` custom node (or the SANA authors'
  fork ``Efficient-Large-Model/ComfyUI_ExtraModels``): its ``Sana/loader.py`` builds the native ``SanaMS``
  network as the ``diffusion_model`` of a ComfyUI ``BaseModel`` (diffusers checkpoints are converted to native
  keys first). The node ships no LoRA loader for SANA (``convert_lora_state_dict`` in its
  ``Sana/diffusers_convert.py`` is marked unused); kohya-ss/sd-scripts has no SANA network either.
* A LoRA reaches that model through ComfyUI's own ``LoraLoaderModelOnly``: ``comfy/lora.py``
  ``model_lora_keys_unet`` maps ``lora_unet_<path with "." → "_">`` to every model weight
  ``diffusion_model.<path>.weight`` (SANA's ``unet_config`` has no ``num_res_blocks``, so no diffusers-name
  map applies), and ``comfy/weight_adapter/lora.py`` (``LoRAAdapter.load`` / ``calculate_weight``) reads
  ``<name>.lora_up.weight``, ``<name>.lora_down.weight`` and an optional ``<name>.alpha`` and patches
  ``W += strength · alpha / rows(lora_down) · lora_up @ lora_down`` (factor 1 without ``.alpha``).

So each LoRA'd diffusers module becomes a kohya-named LoRA on its native module. Native SANA fuses
``attn.qkv`` (q, k, v) and ``cross_attn.kv_linear`` (k, v): their pieces' ``lora_A`` are stacked into one
``lora_down`` and their ``lora_B`` placed block-diagonally in ``lora_up``, so ``lora_up @ lora_down`` is exactly
the stacked per-piece updates (a piece without a LoRA contributes zero rows). ``.alpha`` is written so that
``alpha / rows`` is the trained PEFT scale; pieces trained at different scales have them folded into their
``lora_up`` blocks instead (``alpha = rows``, factor 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

COMFYUI_LORA_FILE = "sana_lora_comfyui.safetensors"
KEY_PREFIX = "lora_unet_"


def comfyui_name(native_module: str) -> str:
    """``blocks.0.attn.qkv`` → ``lora_unet_blocks_0_attn_qkv`` (what ``model_lora_keys_unet`` maps)."""
    return KEY_PREFIX + native_module.replace(".", "_")


def comfyui_state(
    state: Mapping[str, torch.Tensor], scales: Mapping[str, float], *, video: bool = False, guidance: bool = False
) -> dict[str, torch.Tensor]:
    """Diffusers-keyed LoRA tensors (``<module>.lora_A.weight``, ``<module>.lora_B.weight``, unscaled) and PEFT's
    per-module ``scales`` → ``lora_unet_<native>.{lora_down.weight, lora_up.weight, alpha}``."""
    from cosmos_sana_plugins.sana.native_keys import native_module

    pieces: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {}
    arity: dict[str, int] = {}
    for key in state:
        module, _, which = key.partition(".lora_")
        if which != "A.weight":
            if which != "B.weight":
                raise ValueError(f"LoRA tensor {key!r}: only lora_A/lora_B weights convert (no LoRA biases)")
            continue
        native, index, count = native_module(module, video=video, guidance=guidance)
        pieces.setdefault(native, {})[index] = (state[key], state[f"{module}.lora_B.weight"], scales[module])
        arity[native] = count
    out: dict[str, torch.Tensor] = {}
    for native, parts in sorted(pieces.items()):
        down, up, alpha = _fuse(parts, arity[native])
        name = comfyui_name(native)
        out[f"{name}.lora_down.weight"] = down.contiguous()
        out[f"{name}.lora_up.weight"] = up.contiguous()
        out[f"{name}.alpha"] = torch.tensor(alpha, dtype=torch.float32)
    return out


def _fuse(parts: Mapping[int, tuple[torch.Tensor, torch.Tensor, float]], count: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One ``(down, up, alpha)`` whose ``alpha / rows(down) · up @ down`` stacks the pieces' ``scale · B @ A``."""
    if count == 1:
        lora_a, lora_b, scale = parts[0]
        return lora_a, lora_b, scale * lora_a.shape[0]
    order = sorted(parts)
    same_scale = len({parts[i][2] for i in order}) == 1
    down = torch.cat([parts[i][0] for i in order], dim=0)
    rows = parts[order[0]][1].shape[0]
    up = torch.zeros(rows * count, down.shape[0], dtype=down.dtype)
    column = 0
    for i in order:
        lora_a, lora_b, scale = parts[i]
        up[i * rows:(i + 1) * rows, column:column + lora_a.shape[0]] = lora_b if same_scale else lora_b * scale
        column += lora_a.shape[0]
    return down, up, (parts[order[0]][2] if same_scale else 1.0) * down.shape[0]


def write_comfyui_lora(transformer: torch.nn.Module, adapter: str, out: Path, *, pipeline_class: str) -> Path:
    """Adapter ``adapter`` of a SANA transformer as ``out/sana_lora_comfyui.safetensors`` (see the module notes)."""
    from safetensors.torch import save_file

    from cosmos_sana_plugins.sana.lora import adapter_export, adapter_scales

    if pipeline_class != "SanaPipeline":
        raise ValueError(f"--format comfyui: ComfyUI's SANA node runs SanaPipeline models only, not {pipeline_class}")
    state, _ = adapter_export(transformer, adapter)
    guidance = getattr(transformer.config, "guidance_embeds", False)
    tensors = comfyui_state(state, adapter_scales(transformer, adapter), guidance=bool(guidance))
    path = out / COMFYUI_LORA_FILE
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path
