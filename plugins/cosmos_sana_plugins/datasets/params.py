"""``[custom.data] args`` for the built-in datasets (validated strictly, unknown keys are errors).

Sizes, frame counts and the model id default to cosmos-rl's own fields
(``policy.diffusers.inference_size``, ``policy.diffusers.train_frames``,
``policy.model_name_or_path``) so a recipe states them once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cosmos_sana.config.base import StrictModel

#: the shipped prompt sets, ``builtin:NAME`` → (file under ``PROMPTS_DIR``, format)
BUILTIN_PROMPTS = {
    "demo": ("demo.txt", "text"),
    "ocr": ("ocr.txt", "ocr"),
    "geneval": ("geneval_metadata.jsonl", "geneval"),
}
PROMPTS_DIR = Path(__file__).parent / "prompts"

MediaLayout = Literal["auto", "folder", "sana_meta", "imagefolder", "jsonl", "zip"]


class _MediaParams(StrictModel):
    path: str = Field(description="dataset folder, JSONL manifest or .zip")
    layout: MediaLayout = Field(
        default="auto",
        description="auto: meta_data.json → sana_meta, metadata.jsonl (Hugging Face imagefolder) → imagefolder, "
        ".jsonl → jsonl, .zip → zip, else folder "
        "(NAME.ext + NAME.txt or NAME.json sidecars)",
    )
    size: tuple[int, int] | None = Field(
        default=None, description="[height, width]; default policy.diffusers.inference_size"
    )
    cache_dir: str | None = Field(
        default=None, description="cache VAE latents and text embeddings here (keyed by content hash)"
    )
    cache_model_id: str | None = Field(
        default=None, description="model id in the cache key; default policy.model_name_or_path"
    )
    allow_outside_root: bool = Field(
        default=False,
        description="read media and caption files whose symbolic links lead outside the dataset folder "
        "(off: each such sample is refused by name)",
    )

    @model_validator(mode="after")
    def _positive_size(self) -> _MediaParams:
        if self.size is not None and min(self.size) <= 0:
            raise ValueError(f"size must be positive [height, width], got {list(self.size)}")
        return self


class ImageDataParams(_MediaParams):
    resize: Literal["center_crop", "bucket"] = Field(
        default="center_crop",
        description="center_crop: cover `size` then crop the centre; bucket: nearest aspect-ratio bin "
        "of diffusers' ASPECT_RATIO_<size>_BIN (square `size` of 256/512/1024/2048/4096)",
    )


class VideoDataParams(_MediaParams):
    num_frames: int | None = Field(
        default=None, ge=1, description="frames per clip; default policy.diffusers.train_frames"
    )
    fps: float | None = Field(default=None, gt=0, description="resample to this frame rate (exclusive with stride)")
    stride: int = Field(default=1, ge=1, description="take every stride-th source frame")
    short_clip: Literal["error", "pad_last", "loop"] = Field(
        default="error",
        description="a clip with fewer frames than asked: a bad sample (error), repeat its last frame "
        "(pad_last), or wrap around to its first frame (loop)",
    )

    @model_validator(mode="after")
    def _one_rate(self) -> VideoDataParams:
        if self.fps is not None and self.stride != 1:
            raise ValueError("set either fps or stride, not both")
        return self


class PromptDataParams(StrictModel):
    path: str = Field(description="prompt file (.txt or .jsonl) or builtin:NAME (demo, ocr, geneval)")
    format: Literal["auto", "text", "ocr", "jsonl", "geneval"] = Field(
        default="auto",
        description="text: one prompt a line; ocr: one a line with the target in double quotes; jsonl: "
        "{prompt, ...metadata}; geneval: GenEval metadata records; auto: by builtin name or suffix "
        "(.txt → text, .jsonl → geneval when the first record has `include`, else jsonl)",
    )

    @field_validator("path")
    @classmethod
    def _known_builtin(cls, value: str) -> str:
        name = value.removeprefix("builtin:")
        if value.startswith("builtin:") and name not in BUILTIN_PROMPTS:
            raise ValueError(f"unknown builtin prompt set {name!r} (have {sorted(BUILTIN_PROMPTS)})")
        return value


def config_value(cosmos_config: Any, dotted: str) -> Any:
    """``policy.diffusers.inference_size`` from a cosmos-rl ``Config`` or a raw TOML dict; None if absent."""
    node = cosmos_config
    for part in dotted.split("."):
        if node is None:
            return None
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
    return node
