"""The flow-matching objective on real data: SFT's loss and DDRL's data term.

Items are the ``images``/``videos`` datasets' (pixels in [-1, 1], or latent-cache hits);
:func:`encode_items` turns them into latents and text conditioning through the model (and
the dataset's latent cache), :func:`flow_matching_per_sample` draws σ from
``[policy.diffusers]`` ``weighting_scheme`` (logit-normal by default) shifted by
``train_flow_shift`` and returns ``mean((v_θ(x_σ, σ) − (ε − x0))²)`` per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cosmos_sana_plugins.sana.text import TextConditioning
from cosmos_sana_plugins.trainers import losses


def encode_items(model: Any, items: Sequence[Mapping[str, Any]]) -> tuple[torch.Tensor, TextConditioning]:
    """Latents and text of dataset items, on the model's device (cache hits skip the encoders)."""
    from cosmos_sana_plugins.datasets.latent_cache import encode_batch

    def encoder(pixels: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        text = model.encode_text(prompts)
        return {"latents": model.visual_embedding(pixels), "text_embeds": text.embeds, "text_mask": text.mask}

    encoded = encode_batch(items, encoder)
    device = model.current_device()
    text = TextConditioning(encoded["text_embeds"].to(device), encoded["text_mask"].to(device))
    return encoded["latents"].to(device, torch.float32), text


def flow_matching_per_sample(model: Any, latents: torch.Tensor, text: TextConditioning) -> torch.Tensor:
    """Per-sample flow-matching loss at logit-normal (shifted) σ; differentiable in the transformer."""
    sigmas = model.sample_training_sigmas(latents.shape[0])
    noise = torch.randn_like(latents)
    velocity = model.velocity(losses.noised(latents, noise, sigmas), sigmas, text)
    return losses.flow_matching_loss(velocity, latents, noise)
