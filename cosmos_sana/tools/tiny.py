"""Random-initialised SANA / SANA-Video pipeline folders, built offline.

``build_pipeline`` writes a folder that stock ``SanaPipeline.from_pretrained`` (or
``SanaVideoPipeline``) loads with no network. Same preset, seed, device and dtype →
byte-identical safetensors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cosmos_sana.tools.tiny_presets import PRESETS, Preset, resolve_preset

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline


def build_transformer(preset: Preset, **overrides: Any) -> torch.nn.Module:
    """The preset's diffusers transformer (random init, current default device), ``overrides`` win."""
    import diffusers

    cls = getattr(diffusers, preset.transformer_class)
    return cls(**{**preset.transformer, **overrides})


def _quiet(step: str) -> None:
    """The default ``progress`` callback: says nothing."""


def build_components(
    preset: Preset,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """``tokenizer, text_encoder, transformer, vae, scheduler`` for ``preset``, created directly on ``device``;
    ``progress`` is told each step before it starts."""
    import diffusers
    from transformers import Gemma2Config, Gemma2Model

    from cosmos_sana.tools.tiny_tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    text_config = Gemma2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        attn_implementation="eager",
        **preset.text_encoder,
    )
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        progress("random-initialising the text encoder")
        text_encoder = Gemma2Model(text_config)
        progress("random-initialising the transformer")
        transformer = build_transformer(preset)
        progress("random-initialising the VAE")
        vae = getattr(diffusers, preset.vae_class)(**preset.vae)
    modules = {"text_encoder": text_encoder, "transformer": transformer, "vae": vae}
    for module in modules.values():
        if next(module.parameters()).dtype != dtype:
            module.to(dtype=dtype)
        module.eval()
    scheduler = diffusers.DPMSolverMultistepScheduler(**preset.scheduler)
    return {"tokenizer": tokenizer, "scheduler": scheduler, **modules}


def build_pipeline(
    out_dir: str | Path,
    *,
    video: bool = False,
    preset: str = "tiny",
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[str], None] = _quiet,
) -> Path:
    """Write a random-initialised pipeline folder for ``preset`` to ``out_dir`` and return its path;
    ``progress`` is told each step before it starts."""
    import diffusers

    chosen = resolve_preset(preset, video)
    out = Path(out_dir)
    components = build_components(chosen, seed=seed, device=device, dtype=dtype, progress=progress)
    pipe: DiffusionPipeline = getattr(diffusers, chosen.pipeline_class)(**components)
    progress(f"writing safetensors to {out}")
    pipe.save_pretrained(out, safe_serialization=True)
    _write_readme(out, chosen, seed=seed, dtype=dtype, vocab_size=len(components["tokenizer"]))
    return out


def parameter_counts(preset: str, video: bool = False) -> dict[str, int]:
    """Parameters per model component of ``preset``, counted on the meta device (no memory used)."""
    import diffusers
    from transformers import Gemma2Config, Gemma2Model

    from cosmos_sana.tools.tiny_tokenizer import build_tokenizer

    chosen = resolve_preset(preset, video)
    vocab_size = len(build_tokenizer())
    with torch.device("meta"):
        models = {
            "transformer": build_transformer(chosen),
            "vae": getattr(diffusers, chosen.vae_class)(**chosen.vae),
            "text_encoder": Gemma2Model(Gemma2Config(vocab_size=vocab_size, **chosen.text_encoder)),
        }
    return {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}


def _write_readme(out: Path, preset: Preset, *, seed: int, dtype: torch.dtype, vocab_size: int) -> None:
    text_layers = preset.text_encoder["num_hidden_layers"]
    hidden = preset.text_encoder["hidden_size"]
    lines = [
        f"# Random-initialised {preset.pipeline_class} (preset `{preset.name}`)",
        "",
        f"{preset.description}.",
        "",
        "Built offline by `cosmos-sana make-tiny`; every weight is random, so outputs are noise.",
        f"- seed {seed}, dtype {str(dtype).removeprefix('torch.')}",
        f"- transformer: `{preset.transformer_class}` {json.dumps(preset.transformer, sort_keys=True)}",
        f"- vae: `{preset.vae_class}` {json.dumps(preset.vae, sort_keys=True) if preset.vae else '(class defaults)'}",
        f"- text encoder: `Gemma2Model` hidden {hidden}, {text_layers} layers (Gemma-2-2B: hidden 2304, 26 layers),"
        f" with a byte-level BPE tokenizer trained locally (vocabulary {vocab_size}, not Gemma's)",
        f"- scheduler: `DPMSolverMultistepScheduler` {json.dumps(preset.scheduler, sort_keys=True)}",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


__all__ = ["PRESETS", "build_components", "build_pipeline", "build_transformer", "parameter_counts"]
