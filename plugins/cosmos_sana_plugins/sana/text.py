"""Prompt encoding for SANA / SANA-Video: the ONE function rollout, training and inference share.

Public API::

    TextConditioning(embeds: Tensor[B, L, D], mask: Tensor[B, L])   # mask: 1 = token, 0 = padding
        .to(device=None, dtype=None) -> TextConditioning
        .select(index) -> TextConditioning        # rows (int list / slice / LongTensor)
        .repeat_interleave(n) -> TextConditioning # each row n times (a group of n samples per prompt)
        .cat([a, b, ...]) -> TextConditioning     # staticmethod, along the batch
        .as_transformer_kwargs(dtype) -> {"encoder_hidden_states", "encoder_attention_mask"}
    chi_lines(mode: "off" | "image" | "video") -> list[str] | None
    encode_prompts(pipeline, prompts, *, chi="off", max_sequence_length=300, suffix="", device=None)
        -> TextConditioning
    encode_negative(pipeline, batch_size, *, max_sequence_length=300, device=None) -> TextConditioning
    pipeline_call_kwargs(chi, max_sequence_length) -> dict   # the same conditioning in a stock pipeline call

SANA's own rules (diffusers ``SanaPipeline.encode_prompt``): prompts are lower-cased and
stripped; with the complex-human-instruction (CHI) prefix the text encoder sees
``CHI + prompt`` and SANA keeps the BOS position plus the last ``max_sequence_length - 1``
positions; the unconditional ("") prompt never gets the prefix. ``encode_prompts`` calls
that diffusers method, so an exported pipeline called with :func:`pipeline_call_kwargs`
conditions exactly as training did (the ``suffix`` must then be appended to the prompt).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import torch

ChiMode = Literal["off", "image", "video"]


@dataclass(frozen=True)
class TextConditioning:
    """Encoded prompts: text-encoder states and their padding mask (cross-attention keys)."""

    embeds: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self) -> None:
        if self.embeds.shape[:2] != self.mask.shape:
            raise ValueError(f"text embeds {tuple(self.embeds.shape)} and mask {tuple(self.mask.shape)} disagree")

    def __len__(self) -> int:
        return self.embeds.shape[0]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> TextConditioning:
        return TextConditioning(self.embeds.to(device=device, dtype=dtype), self.mask.to(device=device))

    def select(self, index: Any) -> TextConditioning:
        return TextConditioning(self.embeds[index], self.mask[index])

    def repeat_interleave(self, repeats: int) -> TextConditioning:
        return TextConditioning(self.embeds.repeat_interleave(repeats, 0), self.mask.repeat_interleave(repeats, 0))

    @staticmethod
    def cat(parts: Sequence[TextConditioning]) -> TextConditioning:
        return TextConditioning(torch.cat([p.embeds for p in parts]), torch.cat([p.mask for p in parts]))

    def as_transformer_kwargs(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Keyword arguments of the SANA transformers' ``forward`` (the mask goes to cross-attention)."""
        return {"encoder_hidden_states": self.embeds.to(dtype), "encoder_attention_mask": self.mask}


def chi_lines(mode: ChiMode) -> list[str] | None:
    """SANA's complex-human-instruction lines for ``mode``, as diffusers ships them (None for ``off``)."""
    if mode == "off":
        return None
    if mode not in ("image", "video"):
        raise ValueError(f"complex_human_instruction must be 'off', 'image' or 'video', got {mode!r}")
    return list(_shipped_chi(mode))


@cache
def _shipped_chi(mode: str) -> tuple[str, ...]:
    """The default ``complex_human_instruction`` of the image or video pipeline's ``__call__``."""
    from diffusers import SanaPipeline, SanaVideoPipeline

    pipeline_cls = SanaPipeline if mode == "image" else SanaVideoPipeline
    return tuple(inspect.signature(pipeline_cls.__call__).parameters["complex_human_instruction"].default)


def encode_prompts(
    pipeline: Any,
    prompts: Sequence[str],
    *,
    chi: ChiMode = "off",
    max_sequence_length: int = 300,
    suffix: str = "",
    device: torch.device | str | None = None,
) -> TextConditioning:
    """Encode ``prompts`` (each plus ``suffix``) with the pipeline's tokenizer and text encoder.

    Runs without gradients; embeddings come out in the text encoder's dtype on ``device``
    (default: the text encoder's device).
    """
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise TypeError(f"prompts must be a sequence of str, got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("no prompts to encode")
    device = torch.device(device) if device is not None else pipeline.text_encoder.device
    with torch.no_grad():
        embeds, mask, _, _ = pipeline.encode_prompt(
            [p + suffix for p in prompts],
            do_classifier_free_guidance=False,
            device=device,
            max_sequence_length=max_sequence_length,
            complex_human_instruction=chi_lines(chi),
        )
    return TextConditioning(embeds, mask)


def encode_negative(
    pipeline: Any,
    batch_size: int = 1,
    *,
    max_sequence_length: int = 300,
    device: torch.device | str | None = None,
) -> TextConditioning:
    """The unconditional ("") prompt repeated ``batch_size`` times, as SANA encodes it (no CHI)."""
    one = encode_prompts(pipeline, [""], chi="off", max_sequence_length=max_sequence_length, device=device)
    return TextConditioning(one.embeds.expand(batch_size, -1, -1), one.mask.expand(batch_size, -1))


def pipeline_call_kwargs(chi: ChiMode, max_sequence_length: int) -> dict[str, Any]:
    """Arguments that make a stock ``SanaPipeline``/``SanaVideoPipeline`` call encode like training."""
    return {"complex_human_instruction": chi_lines(chi), "max_sequence_length": max_sequence_length}
