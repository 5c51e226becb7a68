"""Attention processors for SANA's transformer blocks that do less work than diffusers' ones.

* :class:`Bf16LinearAttnProcessor` — the ReLU linear self-attention without diffusers' fp32
  copies of q, k and v (``SanaLinearAttnProcessor2_0`` upcasts them): the two small matmuls
  run in the model dtype with fp32 accumulation, the normaliser division in fp32. Output
  within bf16 rounding of the fp32 maths (tests); the same maths for fp32 models.
* :class:`TextKVAttnProcessor` — the text cross-attention (as ``SanaAttnProcessor2_0``) that can
  take its keys and values precomputed: they depend on the prompt only, so a sampler computes
  them once per prompt batch instead of at every step (:func:`text_keys_values`, :func:`armed`).

Both are plain diffusers attention processors; ``set_*`` install or remove them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F

from cosmos_sana_plugins.sana.text import TextConditioning

LinearAttention = Literal["fp32", "bf16"]
KeyValue = tuple[torch.Tensor, torch.Tensor]


class Bf16LinearAttnProcessor:
    """SANA ReLU linear attention, ``out_n = Σ_m (q_n·k_m) v_m / Σ_m q_n·k_m``, in the model dtype.

    ``kv = Kᵀ V`` and ``Σ_m k_m`` reduce over the tokens (GEMM / fp32 sum), ``q·[kv | Σk]``
    gives numerator and denominator in one matmul; only the division runs in fp32.
    """

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        dtype = hidden_states.dtype
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        q, k, v = _heads(F.relu(query), attn.heads), _heads(F.relu(key), attn.heads), _heads(value, attn.heads)
        kv = torch.matmul(k.transpose(-1, -2), v)  # [B, H, d, d]
        k_sum = k.sum(dim=-2, dtype=torch.float32).unsqueeze(-1).to(kv.dtype)  # [B, H, d, 1]
        both = torch.matmul(q, torch.cat([kv, k_sum], dim=-1))  # [B, H, N, d + 1]
        out = both[..., :-1].float() / (both[..., -1:].float() + 1e-15)
        out = out.to(dtype).transpose(1, 2).flatten(2)  # [B, N, H·d]
        out = attn.to_out[1](attn.to_out[0](out))
        if dtype == torch.float16:
            out = out.clip(-65504, 65504)
        return out


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)  # [B, L, H·d] → [B, H, L, d]


def attention_keys_values(attn: Any, context: torch.Tensor) -> KeyValue:
    """Keys and values ``[B, H, L, d]`` of cross-attention ``attn`` for text states ``context``."""
    key, value = attn.to_k(context), attn.to_v(context)
    if attn.norm_k is not None:
        key = attn.norm_k(key)
    return _heads(key, attn.heads), _heads(value, attn.heads)


class TextKVAttnProcessor:
    """SANA text cross-attention; uses ``self.kv`` (keys, values ``[B, H, L, d]``) when set."""

    def __init__(self) -> None:
        self.kv: KeyValue | None = None

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch = hidden_states.shape[0]
        key, value = self.kv if self.kv is not None else attention_keys_values(attn, encoder_hidden_states)
        query = attn.to_q(hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        query = _heads(query, attn.heads)
        if attention_mask is not None:  # the transformer's [B, 1, L] bias → [B, H, 1, L], as diffusers does
            length = key.shape[-2]
            attention_mask = attn.prepare_attention_mask(attention_mask, length, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=0.0)
        out = out.transpose(1, 2).flatten(2).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        return out / attn.rescale_output_factor


def _blocks(transformer: torch.nn.Module) -> Sequence[torch.nn.Module]:
    return getattr(transformer, "transformer_blocks", ())


def set_linear_attention(transformer: torch.nn.Module, mode: LinearAttention) -> int:
    """Diffusers' fp32 processor or :class:`Bf16LinearAttnProcessor` on every SANA linear
    self-attention; returns how many were set (0 for models without one, e.g. SANA-Video)."""
    from diffusers.models.attention_processor import SanaLinearAttnProcessor2_0

    if mode not in ("fp32", "bf16"):
        raise ValueError(f"linear_attention must be 'fp32' or 'bf16', got {mode!r}")
    kinds = (SanaLinearAttnProcessor2_0, Bf16LinearAttnProcessor)
    modules = [m for m in transformer.modules() if isinstance(getattr(m, "processor", None), kinds)]
    for module in modules:
        module.set_processor(Bf16LinearAttnProcessor() if mode == "bf16" else SanaLinearAttnProcessor2_0())
    return len(modules)


def set_text_kv_attention(transformer: torch.nn.Module, enabled: bool) -> int:
    """:class:`TextKVAttnProcessor` (or back to diffusers' ``SanaAttnProcessor2_0``) on the SANA
    image blocks' text cross-attention; returns how many were set."""
    from diffusers.models.transformers.sana_transformer import SanaAttnProcessor2_0

    count = 0
    for block in _blocks(transformer):
        attn = getattr(block, "attn2", None)
        if isinstance(getattr(attn, "processor", None), (SanaAttnProcessor2_0, TextKVAttnProcessor)):
            attn.set_processor(TextKVAttnProcessor() if enabled else SanaAttnProcessor2_0())
            count += 1
    return count


def text_kv_enabled(transformer: torch.nn.Module) -> bool:
    return any(isinstance(getattr(getattr(b, "attn2", None), "processor", None), TextKVAttnProcessor)
               for b in _blocks(transformer))


def text_keys_values(transformer: torch.nn.Module, text: TextConditioning) -> list[KeyValue]:
    """Every block's cross-attention keys and values for ``text``, as the transformer's forward
    computes them (caption projection and norm, then each block's ``to_k``/``to_v``).

    These calls bypass the FSDP2 hooks of the transformer and its blocks, so a sharded model's
    weights are all-gathered here, one FSDP unit at a time (a collective: every rank computes its
    keys and values at the same point of sampling, as it runs each forward). The text goes in at
    the gathered weights' dtype, which FSDP's mixed precision (``train.param_dtype``) sets."""
    with gathered(transformer, transformer.caption_projection, transformer.caption_norm):
        embeds = text.embeds.to(next(transformer.caption_projection.parameters()).dtype)
        context = transformer.caption_projection(embeds)
        context = transformer.caption_norm(context.view(embeds.shape[0], -1, context.shape[-1]))
    pairs = []
    for block in _blocks(transformer):
        with gathered(block, block.attn2):
            pairs.append(attention_keys_values(block.attn2, context))
    return pairs


@contextlib.contextmanager
def gathered(*modules: torch.nn.Module) -> Iterator[None]:
    """The full weights of those ``modules`` that FSDP2 shards (``fully_shard`` units) registered
    on them, sharded again afterwards; other modules are left as they are."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in modules if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()


def text_kv_parameters(transformer: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters :func:`text_keys_values` reads (their in-place version counters tell a
    cache that the weights changed)."""
    modules = [transformer.caption_projection, transformer.caption_norm]
    for block in _blocks(transformer):
        attn = block.attn2
        modules += [m for m in (attn.to_k, attn.to_v, attn.norm_k) if m is not None]
    return [p for m in modules for p in m.parameters()]


@contextlib.contextmanager
def armed(transformer: torch.nn.Module, kv: Sequence[KeyValue] | None) -> Iterator[None]:
    """Forward with precomputed text keys/values ``kv`` (one per block) inside the block; None: no-op."""
    if kv is None:
        yield
        return
    processors = [block.attn2.processor for block in _blocks(transformer)]
    for processor, pair in zip(processors, kv, strict=True):
        processor.kv = tuple(pair)
    try:
        yield
    finally:
        for processor in processors:
            processor.kv = None
