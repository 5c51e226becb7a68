"""Shared pieces of the model-based scorers: options, device/dtype, chunking, preprocessing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import Field

from cosmos_sana.config.base import StrictModel

DTYPES = ("float32", "float16", "bfloat16")
#: OpenAI CLIP's pixel statistics (CLIP, open_clip ViT-H-14, BLIP)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ModelOptions(StrictModel):
    """Options every model-based scorer takes."""

    dtype: Literal["float32", "float16", "bfloat16"] = Field(default="float32", description="weights and compute dtype")
    max_batch: int = Field(default=32, ge=1, description="images per forward pass (video frames count as images)")


def torch_device(device: Any) -> Any:
    import torch

    return torch.device(device) if device is not None else torch.device("cpu")


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def in_chunks(fn: Callable[[Any, list[str]], Any], media: Any, prompts: Sequence[str], size: int) -> list[float]:
    """``fn`` over slices of at most ``size`` samples; the scores concatenated as floats."""
    scores: list[float] = []
    for start in range(0, media.shape[0], size):
        out = fn(media[start:start + size], list(prompts[start:start + size]))
        scores.extend(float(v) for v in out.float().cpu().reshape(-1))
    return scores


def resize_crop_normalize(
    images: Any, size: int, mean: Sequence[float], std: Sequence[float], *, dtype: Any = None
) -> Any:
    """CLIP-style preprocessing of a float ``B×3×H×W`` batch in [0, 1]: bicubic resize of the
    short side to ``size``, centre crop ``size×size``, normalise."""
    from torchvision.transforms.v2 import functional as TF

    out = TF.resize(images, [size], interpolation=TF.InterpolationMode.BICUBIC, antialias=True)
    out = TF.center_crop(out.clamp(0, 1), [size, size])
    out = TF.normalize(out, list(mean), list(std))
    return out.to(dtype) if dtype is not None else out


def preference_mlp(width: int) -> Any:
    """The head shared by the LAION aesthetic predictor and ImageReward:
    ``width→1024→128→64→16→1``, linear layers only (the dropouts are identities at eval);
    parameter names ``0, 2, 4, 6, 7`` as in both checkpoints."""
    from torch import nn

    return nn.Sequential(
        nn.Linear(width, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
        nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
    )
