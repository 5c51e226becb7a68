"""ImageReward v1.0 on transformers' BLIP pieces (not the ``image-reward`` package).

The package pins ``timm==0.6.13`` and ``fairscale==0.4.13`` and imports transformers
internals that moved, so the same network is assembled from ``BlipVisionModel``
(BLIP's ViT) and ``BlipTextModel`` (BLIP's BERT with cross-attention) and the
``ImageReward.pt`` state dict is renamed onto them.

score = (MLP(text_encoder(prompt ⟂ ViT(image))[CLS]) − 0.16717362830052426) / 1.0333394966054072,
prompt tokenised to 35 tokens (padded), image resized (bicubic) and centre-cropped to 224 with CLIP statistics.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from pydantic import Field

from cosmos_sana.config.base import StrictModel
from cosmos_sana.log import get_logger
from cosmos_sana.rewards.weights import from_pretrained, resolve_file
from cosmos_sana_plugins.rewards.common import (
    CLIP_MEAN,
    CLIP_STD,
    ModelOptions,
    in_chunks,
    preference_mlp,
    resize_crop_normalize,
    torch_device,
    torch_dtype,
)

logger = get_logger(__name__)

REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
#: checkpoint parts ImageReward never uses when scoring
UNUSED_PREFIXES = ("blip.vision_proj.", "blip.text_proj.")


class BlipVitOptions(StrictModel):
    """BLIP's ViT (ImageReward uses ViT-L/16 at 224)."""

    image_size: int = 224
    patch_size: int = 16
    width: int = 1024
    layers: int = 24
    heads: int = 16


class ImageRewardOptions(ModelOptions):
    checkpoint: str = Field(default="THUDM/ImageReward/ImageReward.pt", description="local file or org/repo/file")
    med_config: str = Field(
        default="THUDM/ImageReward/med_config.json", description="BLIP text-encoder (BERT) config json"
    )
    tokenizer: str = Field(default="bert-base-uncased", description="BERT tokenizer: hub id or local folder")
    vision: BlipVitOptions = Field(default_factory=BlipVitOptions)
    max_length: int = Field(default=35, ge=2, description="prompt tokens (padded and truncated)")


_VIT_BLOCK = re.compile(r"^blocks\.(\d+)\.(norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.(weight|bias)$")
_VIT_BLOCK_NAMES = {
    "norm1": "layer_norm1", "attn.qkv": "self_attn.qkv", "attn.proj": "self_attn.projection",
    "norm2": "layer_norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
}
_VIT_TOP = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}


def vit_key(key: str) -> str:
    """BLIP ViT (timm naming) → ``BlipVisionModel`` parameter name."""
    if key in _VIT_TOP:
        return _VIT_TOP[key]
    match = _VIT_BLOCK.match(key)
    if match is None:
        raise KeyError(f"unexpected BLIP ViT parameter {key!r}")
    index, part, kind = match.groups()
    return f"encoder.layers.{index}.{_VIT_BLOCK_NAMES[part]}.{kind}"


def convert_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """``ImageReward.pt`` keys → this module's (``vision.*``, ``text.*``, ``mlp.*``)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith("blip.visual_encoder."):
            out["vision." + vit_key(key.removeprefix("blip.visual_encoder."))] = value
        elif key.startswith("blip.text_encoder."):
            out["text." + key.removeprefix("blip.text_encoder.")] = value
        elif key.startswith("mlp.layers."):
            out["mlp." + key.removeprefix("mlp.layers.")] = value
        elif not key.startswith(UNUSED_PREFIXES):
            logger.debug("ImageReward checkpoint: ignoring %s", key)
    return out


def build_network(med_config: dict[str, Any], vision: BlipVitOptions) -> Any:
    """ViT + cross-attending BERT + MLP head, randomly initialised."""
    from torch import nn
    from transformers import BlipTextConfig, BlipVisionConfig
    from transformers.models.blip.modeling_blip import BlipVisionModel
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    vision_config = BlipVisionConfig(
        hidden_size=vision.width, intermediate_size=4 * vision.width, num_hidden_layers=vision.layers,
        num_attention_heads=vision.heads, image_size=vision.image_size, patch_size=vision.patch_size,
        layer_norm_eps=1e-6, hidden_act="gelu",
    )
    text_config = BlipTextConfig(
        vocab_size=med_config["vocab_size"], hidden_size=med_config["hidden_size"],
        encoder_hidden_size=vision.width, intermediate_size=med_config["intermediate_size"],
        num_hidden_layers=med_config["num_hidden_layers"], num_attention_heads=med_config["num_attention_heads"],
        max_position_embeddings=med_config["max_position_embeddings"],
        layer_norm_eps=med_config.get("layer_norm_eps", 1e-12), hidden_act=med_config.get("hidden_act", "gelu"),
        pad_token_id=med_config.get("pad_token_id", 0),
    )
    network = nn.Module()
    network.vision = BlipVisionModel(vision_config)
    network.text = BlipTextModel(text_config, add_pooling_layer=False)
    network.mlp = preference_mlp(med_config["hidden_size"])
    return network


class ImageReward:
    """ImageReward v1.0 scores, batched."""

    def __init__(self, options: ImageRewardOptions, device: Any) -> None:
        import torch
        from transformers import AutoTokenizer

        self.options = options
        self.device, self.dtype = torch_device(device), torch_dtype(options.dtype)
        with open(resolve_file(options.med_config, reward="imagereward", key="med_config")) as f:
            med_config = json.load(f)
        self.network = build_network(med_config, options.vision)
        state = torch.load(
            resolve_file(options.checkpoint, reward="imagereward", key="checkpoint"), map_location="cpu", weights_only=True
        )
        missing, _ = self.network.load_state_dict(convert_checkpoint(state), strict=False)
        if missing:
            raise KeyError(f"reward 'imagereward': {options.checkpoint} lacks {missing[:8]} ({len(missing)} missing)")
        self.network.to(self.device, self.dtype).eval().requires_grad_(False)
        self.tokenizer = from_pretrained(AutoTokenizer.from_pretrained, options.tokenizer, reward="imagereward", key="tokenizer")
        self._tokenizer_lock = threading.Lock()

    def _score(self, images: Any, prompts: list[str]) -> Any:
        import torch

        pixels = resize_crop_normalize(
            images.to(self.device), self.options.vision.image_size, CLIP_MEAN, CLIP_STD, dtype=self.dtype
        )
        image_embeds = self.network.vision(pixel_values=pixels).last_hidden_state
        with self._tokenizer_lock:  # a fast tokenizer is not safe to call from two threads at once
            tokens = self.tokenizer(
                prompts, padding="max_length", truncation=True, max_length=self.options.max_length, return_tensors="pt"
            )
        tokens = tokens.to(self.device)
        text = self.network.text(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device),
        ).last_hidden_state[:, 0]
        return (self.network.mlp(text).squeeze(-1) - REWARD_MEAN) / REWARD_STD

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        import torch

        with torch.inference_mode():
            return in_chunks(self._score, media, prompts, self.options.max_batch)
