"""Sol-RL best-of-n rollouts and the transformers they run on.

Per prompt, ``num_drafts`` seeds are drafted with ``preview_steps`` deterministic (ODE) steps
on the preview transformer and scored; the best ``⌈k/2⌉`` and worst ``⌊k/2⌋`` seeds
(``k = [rollout] n_generation``) are regenerated at full quality with the rollout's own
sampler on the full-rollout transformer. A seed fixes a sample's initial noise (drawn first
from its generator), so the regenerated sample starts where its draft did.

Transformers (``preview_model`` / ``fullrollout_model``):

* ``peft`` — the live model, LoRA unmerged;
* ``compile`` — a copy with the rollout policy's LoRA merged in, ``torch.compile``\\ d;
  refreshed in place (base + ΔW per LoRA layer) whenever that policy's weights change;
* ``fp8`` — a merged copy whose transformer-block linears are torchao float8
  (GPU of compute capability ≥ 8.9), rebuilt when the policy changes;
* ``nvfp4`` — likewise with torchao NVFP4 (Blackwell, capability ≥ 10.0, only).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cosmos_sana.config.best_of_n import BestOfNOptions
from cosmos_sana.log import get_logger
from cosmos_sana_plugins.sana.sampling import SampleOutput, SamplerSettings, Trajectory, generators_for, sample
from cosmos_sana_plugins.sana.text import TextConditioning
from cosmos_sana_plugins.trainers.losses import auto_rollout_batch_size, best_and_worst
from cosmos_sana_plugins.trainers.policies import TransformerView

logger = get_logger(__name__)

#: minimum CUDA compute capability per low-precision preview
_CAPABILITY = {"fp8": (8, 9), "nvfp4": (10, 0)}


def check_preview_support(kind: str, device: torch.device) -> None:
    """Refuse a low-precision preview the device cannot run (clear message naming the key)."""
    if kind not in _CAPABILITY:
        return
    key = "custom.rollout.best_of_n.preview_model"
    need = _CAPABILITY[kind]
    gpu = {"fp8": "Ada/Hopper or newer", "nvfp4": "Blackwell"}[kind]
    if device.type != "cuda":
        raise ValueError(f"{key} = {kind!r} needs a CUDA GPU ({gpu}); this run's device is {device}")
    capability = torch.cuda.get_device_capability(device)
    if capability < need:
        raise ValueError(
            f"{key} = {kind!r} needs a {gpu} GPU (compute capability >= {need[0]}.{need[1]}); "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}"
        )
    try:
        import torchao  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"{key} = {kind!r} needs torchao (pip install torchao)") from exc


def _tuner_layers(module: torch.nn.Module) -> list[tuple[str, Any]]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [(path, sub) for path, sub in module.named_modules() if isinstance(sub, BaseTunerLayer)]


def _quantize(module: torch.nn.Module, kind: str) -> None:
    from torchao.quantization import quantize_

    if kind == "fp8":
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig as Config
    else:
        from torchao.prototype.mx_formats import NVFP4DynamicActivationNVFP4WeightConfig as Config

    def blocks_linear(mod: torch.nn.Module, fqn: str) -> bool:
        return (
            isinstance(mod, torch.nn.Linear)
            and fqn.startswith("transformer_blocks.")
            and mod.in_features % 16 == 0
            and mod.out_features % 16 == 0
        )

    # torchao's FP8 config by default switches on inductor's coordinate-descent tuning for the whole
    # process (set_inductor_config=True), which made the first compile of a launch (this copy, the
    # full-rollout copy, the speed features) take over 5 minutes at SANA-600M shapes on an H200.
    options = {"set_inductor_config": False} if kind == "fp8" else {}
    quantize_(module, Config(**options), filter_fn=blocks_linear)


class MergedTransformer:
    """A plain (LoRA-merged) copy of the rollout policy's transformer, kept current.

    ``source()`` returns ``(transformer, adapter)``: the live transformer and the adapter
    to merge (None for full-parameter weights); ``version()`` changes whenever those
    weights do.
    """

    def __init__(self, kind: str, source: Callable[[], tuple[torch.nn.Module, str | None]], version: Callable[[], int]):
        if kind not in ("compile", "fp8", "nvfp4"):
            raise ValueError(f"no merged copy for {kind!r}")
        self.kind, self._source, self._version = kind, source, version
        self.module: torch.nn.Module | None = None
        self.compiled: Any = None
        self._built_at: int | None = None

    def _build(self) -> None:
        live, adapter = self._source()
        clone = copy.deepcopy(live)
        for module in clone.modules():  # a copied in-place compile would still call the live module
            module._compiled_call_impl = None
        if adapter is not None:
            clone.fuse_lora(adapter_names=[adapter])
            clone.unload_lora()
        clone.requires_grad_(False).eval()
        if self.kind != "compile":
            _quantize(clone, self.kind)
        self.module = clone
        self.compiled = torch.compile(clone)

    @torch.no_grad()
    def _refresh_in_place(self) -> None:
        live, adapter = self._source()
        if adapter is None:
            torch._foreach_copy_(list(self.module.parameters()), list(live.parameters()))
            return
        for path, layer in _tuner_layers(live):
            merged = self.module.get_submodule(path)
            merged.weight.copy_(layer.base_layer.weight + layer.get_delta_weight(adapter).to(merged.weight.dtype))

    def get(self) -> Any:
        """The current merged transformer (compiled)."""
        version = self._version()
        if self.module is None or (self.kind != "compile" and version != self._built_at):
            self._build()
        elif version != self._built_at:
            self._refresh_in_place()
        self._built_at = version
        return self.compiled


def _concat(outputs: Sequence[SampleOutput]) -> SampleOutput:
    if len(outputs) == 1:
        return outputs[0]
    first = outputs[0].trajectory
    trajectory = Trajectory(
        latents=torch.cat([o.trajectory.latents for o in outputs]),
        sigmas=first.sigmas,
        log_probs=torch.cat([o.trajectory.log_probs for o in outputs]),
        stds=first.stds,
        sampler=first.sampler,
        eta=first.eta,
    )
    media = None if outputs[0].media is None else torch.cat([o.media for o in outputs])
    return SampleOutput(torch.cat([o.latents for o in outputs]), trajectory, media)


#: called with (first row, that chunk's output) as soon as a chunk is sampled
ChunkCallback = Callable[[int, SampleOutput], None]


def sample_in_chunks(
    model: Any,
    text: TextConditioning,
    seeds: Sequence[int],
    settings: SamplerSettings,
    chunk: int,
    on_chunk: ChunkCallback | None = None,
) -> SampleOutput:
    """:func:`~cosmos_sana_plugins.sana.sampling.sample` over ``text`` rows (sample ``i`` seeded by ``seeds[i]``), ``chunk`` rows per call."""
    device = model.current_device()
    outputs = []
    for start in range(0, len(seeds), chunk):
        rows = slice(start, start + chunk)
        outputs.append(sample(model, text.select(rows), generators_for(seeds[rows], device), settings))
        if on_chunk is not None:
            on_chunk(start, outputs[-1])
    return _concat(outputs)


Scorer = Callable[[torch.Tensor, list[str], list[dict]], Sequence[float]]


class BestOfNSampler:
    """Draft, score, keep best/worst seeds, regenerate (per prompt, prompt-major)."""

    def __init__(self, options: BestOfNOptions, n_generation: int, score: Scorer) -> None:
        if not 1 <= n_generation <= options.num_drafts:
            raise ValueError(
                f"[rollout] n_generation = {n_generation} (the full_rollout_num) must be in "
                f"[1, custom.rollout.best_of_n.num_drafts = {options.num_drafts}]"
            )
        self.options, self.keep, self.score = options, n_generation, score
        self.chunk = options.rollout_batch_size or auto_rollout_batch_size(options.num_drafts, options.batch_cap)

    def generate(
        self,
        preview: Any,
        full: Any,
        text: TextConditioning,
        prompts: Sequence[str],
        metadata: Sequence[dict],
        settings: SamplerSettings,
        draw_seeds: Callable[[int], list[int]],
        on_chunk: ChunkCallback | None = None,
    ) -> tuple[SampleOutput, list[int], torch.Tensor]:
        """``(full rollouts [P·k], their seeds, draft scores [P, N])`` for ``P`` prompts' ``text``;
        ``on_chunk`` sees the full rollouts' chunks."""
        n_drafts, num_prompts = self.options.num_drafts, len(prompts)
        seeds = draw_seeds(num_prompts * n_drafts)
        draft_settings = dataclasses.replace(settings, num_steps=self.options.preview_steps, sampler="ode", eta=0.0)
        started = _synchronized_clock()
        drafts = sample_in_chunks(preview, text.repeat_interleave(n_drafts), seeds, draft_settings, self.chunk)
        drafted = _synchronized_clock()
        scores = torch.as_tensor(
            list(self.score(drafts.media, [p for p in prompts for _ in range(n_drafts)],
                            [m for m in metadata for _ in range(n_drafts)])),
            dtype=torch.float64,
        ).reshape(num_prompts, n_drafts)
        kept = [seeds[i * n_drafts + j] for i in range(num_prompts) for j in best_and_worst(scores[i], self.keep).tolist()]
        scored = _synchronized_clock()
        output = sample_in_chunks(full, text.repeat_interleave(self.keep), kept, settings, self.chunk, on_chunk)
        finished = _synchronized_clock()
        n_drafted, n_full = num_prompts * n_drafts, num_prompts * self.keep
        logger.info(
            "best-of-n: %d drafts at %d steps on %s in %.2f s (%.2f img/s), scored in %.2f s; "
            "%d full rollouts at %d steps on %s in %.2f s (%.2f img/s, with their scoring callbacks)",
            n_drafted, draft_settings.num_steps, self.options.preview_model, drafted - started,
            n_drafted / max(drafted - started, 1e-9), scored - drafted,
            n_full, settings.num_steps, self.options.fullrollout_model, finished - scored,
            n_full / max(finished - scored, 1e-9),
        )
        return output, kept, scores


def _synchronized_clock() -> float:
    """Wall time after the GPU's queued work is done (sampling is asynchronous on CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def transformer_for(kind: str, model_view: Any, merged: MergedTransformer | None) -> Any:
    """The model-like object a sampler runs on for ``kind``."""
    if kind == "peft":
        return model_view
    return TransformerView(model_view, merged.get())
