"""HPSv2.1: open_clip ViT-H-14 with the HPS_v2.1 weights; score = cos(image, text) of normalised features."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from cosmos_sana.rewards.weights import WeightsMissingError, resolve_file
from cosmos_sana_plugins.rewards.common import ModelOptions, in_chunks, resize_crop_normalize, torch_device, torch_dtype


class HpsOptions(ModelOptions):
    arch: str = Field(default="ViT-H-14", description="open_clip architecture name")
    checkpoint: str = Field(
        default="xswu/HPSv2/HPS_v2.1_compressed.pt",
        description="HPS weights: local file or org/repo/file on the hub (a state dict, or {'state_dict': …})",
    )


class HpsV21:
    """Human Preference Score v2.1."""

    def __init__(self, options: HpsOptions, device: Any) -> None:
        import open_clip

        self.options = options
        self.device, self.dtype = torch_device(device), torch_dtype(options.dtype)
        if open_clip.get_model_config(options.arch) is None:
            raise WeightsMissingError(
                f"reward 'hpsv2.1': args.arch = {options.arch!r} is not an open_clip architecture "
                f"(known: ViT-H-14, ViT-L-14, …; add others with open_clip.add_model_config)"
            )
        checkpoint = resolve_file(options.checkpoint, reward="hpsv2.1", key="checkpoint")
        self.model = open_clip.create_model(options.arch, pretrained=checkpoint, weights_only=True)
        self.model.to(self.device, self.dtype).eval().requires_grad_(False)
        self.tokenizer = open_clip.get_tokenizer(options.arch)
        cfg = self.model.visual.preprocess_cfg
        self.size = cfg["size"] if isinstance(cfg["size"], int) else cfg["size"][0]
        self.mean, self.std = cfg["mean"], cfg["std"]

    def _score(self, images: Any, prompts: list[str]) -> Any:
        pixels = resize_crop_normalize(images.to(self.device), self.size, self.mean, self.std, dtype=self.dtype)
        image = self.model.encode_image(pixels, normalize=True)
        text = self.model.encode_text(self.tokenizer(prompts).to(self.device), normalize=True)
        return (image * text).sum(dim=-1)

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        import torch

        with torch.inference_mode():
            return in_chunks(self._score, media, prompts, self.options.max_batch)
