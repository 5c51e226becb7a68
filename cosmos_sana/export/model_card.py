"""The model card (``README.md``) every export carries, written with ``huggingface_hub.ModelCard``.

It names the base, the algorithm, the reward(s), the training step and the recipe's main settings
(from the checkpoint's ``run_config.json``; ``convert-to-dcp`` output has none), and shows how to load
the export with diffusers, offline included (``load_lora_weights`` needs ``weight_name=`` offline).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosmos_sana.checkpoint.training import read_run_config
from cosmos_sana.export.writers import LORA_FILE, NATIVE_FILE, PEFT_FOLDER
from cosmos_sana.value_rules import MISSING
from cosmos_sana.value_rules import lookup as lookup_or_missing

CARD_FILE = "README.md"
#: ``(label, dotted key in the run config)`` rows of the card's recipe table
RECIPE_ROWS = (
    ("experiment", "logging.experiment_name"),
    ("trainer", "train.train_policy.trainer_type"),
    ("policy type", "train.train_policy.type"),
    ("max steps", "train.max_num_steps"),
    ("learning rate", "train.optm_lr"),
    ("batch per replica", "train.train_batch_per_replica"),
    ("EMA", "train.ema_enable"),
    ("LoRA rank", "policy.lora.r"),
    ("LoRA alpha", "policy.lora.lora_alpha"),
    ("LoRA targets", "policy.lora.target_modules"),
    ("sampling steps", "policy.diffusers.sample.num_steps"),
    ("guidance scale", "policy.diffusers.sample.guidance_scale"),
    ("resolution", "policy.diffusers.inference_size"),
    ("sampler", "custom.rollout.sampler"),
    ("KL beta", "train.train_policy.kl_beta"),
)


def lookup(config: dict[str, Any], dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``; None when any part is missing."""
    value = lookup_or_missing(config, dotted)
    return None if value is MISSING else value


def algorithm_name(run: dict[str, Any]) -> str:
    """The trainer's registered description (e.g. Diffusion-NFT), or its registry key."""
    trainer = lookup(run, "train.train_policy.trainer_type")
    if not trainer:
        return "none (converted weights, no training)" if not run else str(lookup(run, "train.train_policy.type"))
    from cosmos_sana.plugin_manager import installed_plugins

    for entry in installed_plugins().entries("trainer"):
        spec = entry.spec
        if trainer in (spec.name, spec.trainer_type, spec.trainer_type.removeprefix("diffusers_")):
            return f"{trainer} — {spec.description}" if spec.description else trainer
    return str(trainer)


def reward_lines(run: dict[str, Any]) -> list[str]:
    rewards = lookup(run, "custom.rewards") or []
    return [f"{r.get('label') or r['name']} (weight {r.get('weight', 1.0)})" for r in rewards if isinstance(r, dict)]


def hub_base_model(run: dict[str, Any], base_pipeline: str) -> str | None:
    """The base as a Hub repo id when the run named one (``org/name`` that is not a local folder)."""
    from cosmos_sana.local_paths import is_local_model

    name = lookup(run, "policy.model_name_or_path") or base_pipeline
    return name if isinstance(name, str) and not is_local_model(name) else None


def loading_snippet(manifest: dict[str, Any]) -> str:
    """Python that loads this export (``EXPORT`` = this folder, ``BASE`` = the base pipeline)."""
    fmt, cls = manifest["format"], manifest.get("pipeline_class") or "DiffusionPipeline"
    header = f"import torch\nfrom diffusers import {cls}\n\nEXPORT = \"path/to/this/folder\"\n"
    base = f"BASE = \"{manifest['base_pipeline']}\"  # or the base model's Hub id\n"
    if fmt in ("diffusers", "merged"):
        return header + f"pipe = {cls}.from_pretrained(EXPORT, torch_dtype=torch.bfloat16)\n"
    if fmt == "lora":
        return (header + base + f"pipe = {cls}.from_pretrained(BASE, torch_dtype=torch.bfloat16)\n"
                f"# weight_name= is required offline (HF_HUB_OFFLINE=1) and harmless online\n"
                f"pipe.load_lora_weights(EXPORT, weight_name=\"{LORA_FILE}\")\n")
    if fmt == "native":
        return (base + f"# {NATIVE_FILE}: the transformer in native SANA keys ({{\"state_dict\": ...}}), for the\n"
                "# NVlabs/Sana code base; load it there, or convert back with `cosmos-sana convert-to-dcp`.\n")
    if fmt == "comfyui":
        return ("# ComfyUI: copy this folder's .safetensors into ComfyUI/models/loras and apply it with the\n"
                "# LoraLoaderModelOnly node to a SANA model loaded by the ComfyUI_ExtraModels SANA loader.\n"
                "# For diffusers, export the same checkpoint with --format lora.\n")
    return f"# {fmt}: see the files of this folder.\n"


def card_text(manifest: dict[str, Any], run: dict[str, Any]) -> str:
    from huggingface_hub import ModelCardData

    video = manifest.get("pipeline_class") == "SanaVideoPipeline"
    base_id = hub_base_model(run, manifest["base_pipeline"])
    data = ModelCardData(
        library_name="diffusers",
        pipeline_tag="text-to-video" if video else "text-to-image",
        base_model=base_id,
        tags=["cosmos-sana", "sana", *(["lora"] if manifest.get("adapter") else [])],
    )
    rewards = reward_lines(run)
    base = manifest.get("base") or {}
    extra_base = []
    if (base.get("native_checkpoint") or {}).get("source"):
        extra_base.append(f"native checkpoint `{base['native_checkpoint']['source']}`")
    if (base.get("init_from") or {}).get("source"):
        extra_base.append(f"`init_from` `{base['init_from']['source']}`")
    recipe = [(label, lookup(run, key)) for label, key in RECIPE_ROWS]
    lines = [
        "---", data.to_yaml(), "---", "",
        f"# {lookup(run, 'logging.experiment_name') or 'cosmos-sana export'} (step {manifest['step']})", "",
        f"- **Base model**: {base_id or manifest['base_pipeline']}"
        + (f" (weights from {', '.join(extra_base)})" if extra_base else ""),
        f"- **Algorithm**: {algorithm_name(run)}",
        f"- **Reward(s)**: {', '.join(rewards) if rewards else 'none'}",
        f"- **Training steps**: {manifest['step']}",
        f"- **Export**: format `{manifest['format']}`"
        + (f", adapter `{manifest['adapter']}`" if manifest.get("adapter") else "")
        + (", EMA weights" if manifest.get("ema") else ""),
        f"- **Pipeline**: `{manifest.get('pipeline_class')}`",
        "",
        "## Recipe", "",
        "| setting | value |", "|---|---|",
        *[f"| {label} | `{json.dumps(value)}` |" for label, value in recipe if value is not None],
        f"| config sha256 | `{manifest.get('config_sha256')}` |", "",
        "## How to load", "",
        "```python", loading_snippet(manifest).rstrip(), "```", "",
    ]
    if manifest["format"] == "lora":
        lines += [
            f"`{LORA_FILE}` has each module's LoRA scale folded into its `lora_B` (diffusers' metadata says "
            "`lora_alpha = r`), so loaders that ignore metadata apply it at the trained strength. "
            f"`{PEFT_FOLDER}/` holds the same adapter for PEFT with the trained `lora_alpha`.", "",
        ]
    lines += ["## Provenance", "", f"- source checkpoint: `{manifest['source_checkpoint']}`",
              f"- exported at: {manifest['exported_at']}",
              f"- versions: {', '.join(f'{k} {v}' for k, v in sorted(manifest.get('versions', {}).items()))}", ""]
    return "\n".join(lines)


def write_model_card(folder: Path, manifest: dict[str, Any], source: Any) -> Path:
    """``folder/README.md`` for an export of ``source`` (an :class:`~cosmos_sana.export.restore.ExportSource`)."""
    from huggingface_hub import ModelCard

    path = folder / CARD_FILE
    ModelCard(card_text(manifest, read_run_config(source.path))).save(path)
    return path
