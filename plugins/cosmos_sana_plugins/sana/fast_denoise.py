"""Speed features for SANA sampling (and training), each switchable on its own.

* ``linear_attention="bf16"`` — :class:`~cosmos_sana_plugins.sana.fast_attention.Bf16LinearAttnProcessor`:
  the linear self-attention without diffusers' fp32 copies of q, k, v (bf16 GEMMs with fp32
  accumulation, fp32 normalisation). Training too.
* ``cache_text_kv`` — text cross-attention keys/values computed once per prompt batch instead of
  at every step (:class:`FastModel`; ~4 % of a 1024² forward's FLOPs, ~15 % at 512²). Sampling only.
* ``compile_blocks`` — ``torch.compile`` of every transformer block in place (regional, ``dynamic=False``,
  1×1 convolutions lowered to matmuls); blocks share compiled code per shape and adapter state.
  State-dict keys and PEFT layers are unchanged. Training too.
* ``vae_channels_last`` — the VAE in channels-last memory format (cuDNN's NHWC tensor-core
  convolutions, which make up most of a DC-AE decode).
* ``compile_vae`` — the VAE decoder compiled in place (one compile per batch and size).
* ``cuda_graph_max_batch`` — :class:`FastModel` replays the whole transformer forward from a CUDA
  graph for no-grad batches up to this size (one graph per input signature and adapter, captured
  on first use): no per-kernel launch cost, which bounds small batches. Elsewhere than CUDA the
  same static-buffer path runs eagerly.

Public API::

    SpeedOptions(linear_attention="fp32", cache_text_kv=False, compile_blocks=False,
                 vae_channels_last=False, compile_vae=False, compile_mode=None,
                 compile_backend="inductor", cuda_graph_max_batch=0)
                                              # [custom.rollout.speed]'s model, from cosmos_sana.config.rollout
    accelerate(model, options) -> FastModel   # installs the features on model's modules, once
    restore(model)                            # undoes the module changes
    FastModel(model, cuda_graph_max_batch=0, *, cache_text_kv=False)   # sample() through it
    with fast.using(view): sample(fast, ...)  # the same caches for another view (e.g. NFT's old policy)
    compile_blocks(transformer, mode=None, backend="inductor") / uncompile_blocks(transformer)

Weights may change in place between calls (optimizer steps, ``old`` blending): graphs read
parameters by address, and the text key/value cache checks the weights' version counters.
Switching adapters or replacing the transformer selects or captures another graph.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from cosmos_sana.config.rollout import SpeedOptions
from cosmos_sana.log import get_logger
from cosmos_sana_plugins.sana import fast_attention
from cosmos_sana_plugins.sana.fast_attention import KeyValue, armed
from cosmos_sana_plugins.sana.text import TextConditioning

logger = get_logger(__name__)

#: dynamo recompile limit while blocks are compiled (shapes × adapter states × grad modes)
RECOMPILE_LIMIT = 64
_GRAPH_WARMUP = 2


# ---------------------------------------------------------------------------- compilation


def _compile_in_place(module: torch.nn.Module, mode: str | None, backend: str) -> None:
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    kwargs: dict[str, Any] = {"dynamic": False, "backend": backend}
    if mode is not None:
        kwargs["mode"] = mode
    elif backend == "inductor":
        kwargs["options"] = {"conv_1x1_as_mm": True}
    module.compile(**kwargs)


def compile_blocks(transformer: torch.nn.Module, *, mode: str | None = None, backend: str = "inductor") -> None:
    """Compile each transformer block in place (state-dict keys and PEFT layers unchanged)."""
    for block in transformer.transformer_blocks:
        _compile_in_place(block, mode, backend)


def uncompile_blocks(transformer: torch.nn.Module) -> None:
    for block in transformer.transformer_blocks:
        block._compiled_call_impl = None  # what nn.Module.compile sets


# ---------------------------------------------------------------------------- sampling view


@dataclass
class _Static:
    """Input buffers, output and (CUDA) graph of one forward signature."""

    latents: torch.Tensor
    sigmas: torch.Tensor
    embeds: torch.Tensor
    mask: torch.Tensor
    transformer: torch.nn.Module  # keeps the captured weights' owner alive
    capture: bool = False
    kv: list[KeyValue] | None = None
    kv_source: list[KeyValue] | None = None
    output: torch.Tensor | None = None
    graph: Any = None

    def load(
        self, latents: torch.Tensor, sigmas: torch.Tensor, text: TextConditioning, kv: list[KeyValue] | None
    ) -> None:
        self.latents.copy_(latents)
        self.sigmas.copy_(sigmas.expand(latents.shape[0]) if sigmas.ndim == 0 else sigmas)
        self.embeds.copy_(text.embeds)
        self.mask.copy_(text.mask)
        if kv is not None and self.kv_source is not kv:
            torch._foreach_copy_([t for pair in self.kv for t in pair], [t for pair in kv for t in pair])
            self.kv_source = kv


def _version(tensor: torch.Tensor) -> int:
    """In-place modification counter (inference tensors have none and cannot change outside inference mode)."""
    return 0 if tensor.is_inference() else tensor._version


@dataclass
class _TextKVCache:
    """The last text's keys/values and what they were computed from."""

    text: torch.Tensor | None = None  # held, so its identity cannot be reused
    key: tuple = ()
    kv: list[KeyValue] | None = None
    params: list[torch.nn.Parameter] = field(default_factory=list)
    params_of: int | None = None


class FastModel:
    """``model`` whose no-grad ``velocity`` uses cached text keys/values and CUDA graphs as configured.

    Everything else delegates to ``model`` (a :class:`~cosmos_sana_plugins.sana.model.SanaModel`
    or a view of one), so it fits :func:`~cosmos_sana_plugins.sana.sampling.sample`. With grad
    enabled it is ``model.velocity``. ``capture=None`` captures graphs on CUDA devices; ``False``
    runs the static-buffer path eagerly.
    """

    def __init__(
        self,
        model: Any,
        cuda_graph_max_batch: int = 0,
        *,
        cache_text_kv: bool = False,
        capture: bool | None = None,
        max_graphs: int = 4,
    ) -> None:
        self.model = model
        self.cuda_graph_max_batch = cuda_graph_max_batch
        self.cache_text_kv = cache_text_kv
        self.capture = capture
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple, _Static] = OrderedDict()
        self._kv = _TextKVCache()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    @contextlib.contextmanager
    def using(self, model: Any) -> Iterator[FastModel]:
        """Sample through another view of the same model (e.g. a policy view) with these caches."""
        previous, self.model = self.model, model
        try:
            yield self
        finally:
            self.model = previous

    def clear(self) -> None:
        """Drop captured graphs and cached keys/values (frees their memory)."""
        self._graphs.clear()
        self._kv = _TextKVCache()

    def velocity(self, latents: torch.Tensor, sigmas: torch.Tensor, text: TextConditioning) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.model.velocity(latents, sigmas, text)
        transformer = self.model.transformer
        kv = self._text_kv(transformer, text)
        if not 0 < latents.shape[0] <= self.cuda_graph_max_batch:
            with armed(transformer, kv):
                return self.model.velocity(latents, sigmas, text)
        entry = self._entry(latents, text, kv)
        entry.load(latents, sigmas, text, kv)
        if entry.capture and entry.graph is None:
            self._capture(entry)
        if entry.graph is None:
            with armed(transformer, entry.kv):
                return self._forward(entry)
        entry.graph.replay()
        return entry.output.clone()

    def _text_kv(self, transformer: torch.nn.Module, text: TextConditioning) -> list[KeyValue] | None:
        if not (self.cache_text_kv and fast_attention.text_kv_enabled(transformer)):
            return None
        cache = self._kv
        if cache.params_of != id(transformer):
            cache.params, cache.params_of = fast_attention.text_kv_parameters(transformer), id(transformer)
        key = (_version(text.embeds), getattr(self.model, "active_adapter", None), id(transformer),
               sum(p._version for p in cache.params))
        if cache.text is not text.embeds or cache.key != key:
            cache.kv = fast_attention.text_keys_values(transformer, text)
            cache.text, cache.key = text.embeds, key
        return cache.kv

    def _forward(self, entry: _Static) -> torch.Tensor:
        return self.model.velocity(entry.latents, entry.sigmas, TextConditioning(entry.embeds, entry.mask))

    def _entry(self, latents: torch.Tensor, text: TextConditioning, kv: list[KeyValue] | None) -> _Static:
        transformer = self.model.transformer
        key = (
            tuple(latents.shape), latents.dtype, latents.device, tuple(text.embeds.shape), text.embeds.dtype,
            text.mask.dtype, getattr(self.model, "active_adapter", None), id(transformer), kv is not None,
        )
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            return entry
        entry = _Static(
            latents=torch.zeros_like(latents),
            sigmas=torch.zeros(latents.shape[0], dtype=torch.float32, device=latents.device),
            embeds=torch.zeros_like(text.embeds),
            mask=torch.ones_like(text.mask),
            transformer=transformer,
            capture=latents.device.type == "cuda" if self.capture is None else self.capture,
            kv=None if kv is None else [(torch.empty_like(k), torch.empty_like(v)) for k, v in kv],
        )
        self._graphs[key] = entry
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return entry

    def _capture(self, entry: _Static) -> None:
        """Warm up on a side stream (compiles, autotunes) with the loaded inputs, then capture one forward."""
        device = entry.latents.device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with armed(entry.transformer, entry.kv):
            with torch.cuda.stream(side):
                for _ in range(_GRAPH_WARMUP):
                    self._forward(entry)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # reward threads may use the GPU
                entry.output = self._forward(entry)
        entry.graph = graph
        logger.info("captured a CUDA graph for latents %s", tuple(entry.latents.shape))


# ---------------------------------------------------------------------------- install / undo


def accelerate(model: Any, options: SpeedOptions) -> FastModel:
    """Install ``options`` on ``model``'s transformer (and VAE) in place; return the view to sample with.

    Call once per model: compiled modules keep their compiled code (and caches) across calls.
    """
    transformer = model.transformer
    if options.linear_attention == "bf16":
        fast_attention.set_linear_attention(transformer, "bf16")
    if options.cache_text_kv:
        fast_attention.set_text_kv_attention(transformer, True)
    if options.compile_blocks:
        compile_blocks(transformer, mode=options.compile_mode, backend=options.compile_backend)
    if options.vae_channels_last:
        model.vae.to(memory_format=torch.channels_last)
    if options.compile_vae:
        _compile_in_place(model.vae.decoder, options.compile_mode, options.compile_backend)
    return FastModel(model, options.cuda_graph_max_batch, cache_text_kv=options.cache_text_kv)


def restore(model: Any) -> None:
    """Undo :func:`accelerate`'s module changes (diffusers' processors, uncompiled modules)."""
    transformer = model.transformer
    fast_attention.set_linear_attention(transformer, "fp32")
    fast_attention.set_text_kv_attention(transformer, False)
    if hasattr(transformer, "transformer_blocks"):
        uncompile_blocks(transformer)
    vae = getattr(model, "vae", None)
    if vae is not None:
        vae.to(memory_format=torch.contiguous_format)
        if hasattr(vae, "decoder"):
            vae.decoder._compiled_call_impl = None


__all__ = ["FastModel", "SpeedOptions", "accelerate", "compile_blocks", "restore", "uncompile_blocks"]
