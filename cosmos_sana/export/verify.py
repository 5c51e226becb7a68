"""``--verify``: load an export the way a user would, generate once, reject NaN or constant output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.export.writers import LORA_FILE, NATIVE_FILE

#: below this range (max − min) over the whole output, the generation counts as constant
CONSTANT_RANGE = 1e-6


class VerificationFailed(RuntimeError):
    """The export loads but does not generate a usable sample."""


@dataclass(frozen=True)
class VerifyOptions:
    height: int = 256
    width: int = 256
    steps: int = 2
    frames: int = 5  # video only; the Wan VAE needs 4k + 1
    prompt: str = "a red apple on a wooden table"
    device: str | None = None  # default: CUDA when available, else CPU
    seed: int = 0


def load_export(
    out: Path, fmt: str, base: Path, base_transformer: Callable[[], torch.nn.Module] | None = None
) -> Any:
    """The pipeline a user gets from this export with stock diffusers calls. A LoRA goes onto
    ``base_transformer()`` (the weights its run trained on) when given, else onto ``base``'s own."""
    from diffusers import DiffusionPipeline

    if fmt in ("diffusers", "merged"):
        return DiffusionPipeline.from_pretrained(str(out))
    if fmt == "lora":
        components = {"transformer": base_transformer()} if base_transformer is not None else {}
        pipe = DiffusionPipeline.from_pretrained(str(base), **components)
        pipe.load_lora_weights(str(out), weight_name=LORA_FILE)  # offline diffusers needs the name
        if not getattr(pipe.transformer, "peft_config", None):
            raise VerificationFailed(f"{out}: load_lora_weights loaded no adapter (keys must start with 'transformer.')")
        return pipe
    if fmt == "native":
        from cosmos_sana.checkpoint.pipeline_folder import pipeline_class_name
        from cosmos_sana.model_hooks import model_tool

        load_native = model_tool(pipeline_class_name(base), "native_loader")
        transformer = load_native(str(out / NATIVE_FILE), base_config=str(base))
        return DiffusionPipeline.from_pretrained(str(base), transformer=transformer)
    raise ValueError(f"unknown export format {fmt!r}")


def generate_once(pipe: Any, options: VerifyOptions) -> torch.Tensor:
    """One small sample as a float tensor in [0, 1] (images ``B×C×H×W``, video ``B×T×C×H×W``)."""
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    pipe.to(device)
    kwargs: dict[str, Any] = {
        "height": options.height,
        "width": options.width,
        "num_inference_steps": options.steps,
        "use_resolution_binning": False,
        "complex_human_instruction": None,
        "generator": torch.Generator(device).manual_seed(options.seed),
        "output_type": "pt",
    }
    video = hasattr(pipe, "vae_scale_factor_temporal")
    if video:
        kwargs["frames"] = options.frames
    with torch.inference_mode():
        result = pipe(options.prompt, **kwargs)
    return (result.frames if video else result.images).float().cpu()


def check_sample(sample: torch.Tensor) -> dict[str, float]:
    """Raise on NaN/inf or constant output; otherwise return summary statistics."""
    finite = torch.isfinite(sample)
    if not finite.all():
        bad = int((~finite).sum())
        raise VerificationFailed(f"generated sample has {bad} NaN/inf values of {sample.numel()}")
    value_range = float(sample.max() - sample.min())
    if value_range < CONSTANT_RANGE:
        raise VerificationFailed(f"generated sample is constant (value {float(sample.mean()):.6f})")
    return {"min": float(sample.min()), "max": float(sample.max()), "mean": float(sample.mean()), "std": float(sample.std())}


def verify_export(
    out: Path, fmt: str, base: Path, options: VerifyOptions = VerifyOptions(), *,
    base_transformer: Callable[[], torch.nn.Module] | None = None,
) -> dict[str, Any]:
    sample = generate_once(load_export(out, fmt, base, base_transformer), options)
    return {"shape": list(sample.shape), **check_sample(sample), "steps": options.steps}
