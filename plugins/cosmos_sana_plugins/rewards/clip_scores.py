"""CLIP-based scorers on transformers' ``CLIPModel``: PickScore, CLIPScore, LAION aesthetic.

PickScore = logit_scale.exp() · cos(image, text) / 26 (PickScore_v1 weights, the
LAION ViT-H-14 processor). CLIPScore = logits_per_image diagonal / 100 (the cosine for
OpenAI CLIP, whose logit scale is 100). Aesthetic = MLP 768→1024→128→64→16→1 on the
normalised CLIP ViT-L/14 image embedding (LAION ``sac+logos+ava1-l14-linearMSE.pth``).
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import Field

from cosmos_sana.rewards.weights import WeightsMissingError, from_pretrained, resolve_file
from cosmos_sana_plugins.rewards.common import ModelOptions, in_chunks, preference_mlp, torch_device, torch_dtype

AESTHETIC_HEAD_URL = (
    "https://github.com/christophschuhmann/improved-aesthetic-predictor/raw/main/sac+logos+ava1-l14-linearMSE.pth"
)


class PickScoreOptions(ModelOptions):
    model: str = Field(default="yuvalkirstain/PickScore_v1", description="CLIPModel: hub id or local folder")
    processor: str = Field(
        default="laion/CLIP-ViT-H-14-laion2B-s32B-b79K", description="CLIP processor: hub id or local folder"
    )


class ClipScoreOptions(ModelOptions):
    model: str = Field(default="openai/clip-vit-large-patch14", description="CLIPModel: hub id or local folder")
    processor: str | None = Field(default=None, description="CLIP processor; default: the model's")


class AestheticOptions(ModelOptions):
    model: str = Field(default="openai/clip-vit-large-patch14", description="CLIP ViT-L/14: hub id or local folder")
    processor: str | None = Field(default=None, description="CLIP processor; default: the model's")
    head: str | None = Field(
        default=None, description=f"the MLP's .pth state dict (local file or org/repo/file); from {AESTHETIC_HEAD_URL}"
    )


class ClipFeatures:
    """A ``CLIPModel`` with its tokenizer and (fast, on-device) image processor."""

    def __init__(self, reward: str, model: str, processor: str | None, options: ModelOptions, device: Any) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        self.device, self.dtype = torch_device(device), torch_dtype(options.dtype)
        source = processor or model
        key = "processor" if processor else "model"
        self.image_processor = from_pretrained(
            AutoImageProcessor.from_pretrained, source, reward=reward, key=key, use_fast=True
        )
        self.tokenizer = from_pretrained(AutoTokenizer.from_pretrained, source, reward=reward, key=key)
        self._tokenizer_lock = threading.Lock()
        self.model = from_pretrained(CLIPModel.from_pretrained, model, reward=reward, key="model", dtype=self.dtype)
        self.model.to(self.device).eval().requires_grad_(False)

    def image(self, images: Any) -> Any:
        """L2-normalised image embeddings of a float batch in [0, 1]."""
        pixels = self.image_processor(
            images=images.to(self.device), do_rescale=False, return_tensors="pt", device=self.device
        )["pixel_values"].to(self.dtype)
        features = self.model.get_image_features(pixel_values=pixels)
        return features / features.norm(dim=-1, keepdim=True)

    def text(self, prompts: list[str]) -> Any:
        """L2-normalised text embeddings (77 tokens, truncated)."""
        with self._tokenizer_lock:  # a fast tokenizer is not safe to call from two threads at once
            tokens = self.tokenizer(prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
        tokens = tokens.to(self.device)
        features = self.model.get_text_features(**tokens)
        return features / features.norm(dim=-1, keepdim=True)

    def scaled_cosine(self, images: Any, prompts: list[str]) -> Any:
        """logit_scale.exp() · cos(image_i, text_i) per pair."""
        return self.model.logit_scale.exp() * (self.image(images) * self.text(prompts)).sum(dim=-1)


class PickScore:
    """PickScore_v1: logit_scale.exp() · cos / 26."""

    def __init__(self, options: PickScoreOptions, device: Any) -> None:
        self.options = options
        self.clip = ClipFeatures("pickscore", options.model, options.processor, options, device)

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        import torch

        with torch.inference_mode():
            return in_chunks(lambda m, p: self.clip.scaled_cosine(m, p) / 26, media, prompts, self.options.max_batch)


class ClipScore:
    """CLIPScore: logits_per_image diagonal / 100."""

    def __init__(self, options: ClipScoreOptions, device: Any) -> None:
        self.options = options
        self.clip = ClipFeatures("clipscore", options.model, options.processor, options, device)

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        import torch

        with torch.inference_mode():
            return in_chunks(lambda m, p: self.clip.scaled_cosine(m, p) / 100, media, prompts, self.options.max_batch)


class Aesthetic:
    """LAION aesthetic predictor: MLP on the normalised CLIP image embedding (prompt-free)."""

    def __init__(self, options: AestheticOptions, device: Any) -> None:
        import torch

        if options.head is None:
            raise WeightsMissingError(
                f"reward 'aesthetic': set args.head to the MLP weights; download {AESTHETIC_HEAD_URL}"
            )
        self.options = options
        self.clip = ClipFeatures("aesthetic", options.model, options.processor, options, device)
        state = torch.load(resolve_file(options.head, reward="aesthetic", key="head"), map_location="cpu", weights_only=True)
        state = {k.removeprefix("layers."): v for k, v in state.items()}
        self.mlp = preference_mlp(self.clip.model.config.projection_dim)
        self.mlp.load_state_dict(state)
        self.mlp.to(self.clip.device, self.clip.dtype).eval().requires_grad_(False)

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        import torch

        with torch.inference_mode():
            return in_chunks(lambda m, p: self.mlp(self.clip.image(m)).squeeze(-1), media, prompts, self.options.max_batch)
