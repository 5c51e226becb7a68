"""Rollout throughput: our sampler (with each speed feature) vs diffusers and upstream cosmos-rl.

    python bench/bench_rollout.py --preset sana-1600m --device cuda --dtype bfloat16 \\
        --sizes 1024 512 --batches 8 1 --steps 20 [--cfg 1.0 4.5] [--pipeline DIR] --json-out FILE
    python bench/bench_rollout.py --preset tiny --device cpu --steps 2 --sizes 64 --threads 1   # smoke, ~1 min

Implementations, all on the same pipeline object (random weights of the preset's shapes),
same steps, batch, CFG and seeds, text embeddings precomputed for all (text encoding is not timed):

* ``diffusers`` — ``SanaPipeline.__call__`` (``use_resolution_binning=False``, ``output_type="latent"``
  for latents out, ``"pt"`` with decode);
* ``upstream`` — cosmos-rl's ``SanaModel.pipeline_with_logprob``. Its ``__init__`` loads the folder
  again with ``device_map="cuda"`` and needs a ``DiffusersConfig``; the bench instead gives an
  uninitialised instance the shared pipeline's modules (the method reads only those);
* ``ours/<variant>`` — ``sampling.sample`` through ``fast_denoise.accelerate``; the default variants
  add one feature each: ``eager``, ``bf16_attn`` (+ bf16 linear attention, channels-last VAE),
  ``text_kv`` (+ text keys/values once per batch), ``compiled`` (+ compiled blocks),
  ``compiled_graphs`` (+ CUDA graphs); also ``graphs`` (no compile), ``compiled_fp32_attn`` and
  ``recipe`` (toml/sana-image-nft.toml's ``[custom.rollout.speed]``: what a user of that recipe gets).

Each row: median seconds over ``--repeats`` calls after ``--warmup``, images/s, transformer MFU
(FLOPs of one transformer forward from ``FlopCounterMode`` × forwards / time / 790e12) and peak
accelerator memory. Baselines run first, on the unmodified modules. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchlib import (
    DTYPES, PEAK_FLOPS, environment, ensure_pipeline, median, peak_memory_gib, profile_top, ratio,
    recipe_settings, reset_peak_memory, time_call, write_json,
)

GRAPH_ANY_BATCH = 1024
_BF16 = {"linear_attention": "bf16", "vae_channels_last": True}
_KV = {**_BF16, "cache_text_kv": True}
#: each default variant adds one feature to the previous one
VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {},
    "bf16_attn": _BF16,
    "text_kv": _KV,
    "compiled": {**_KV, "compile_blocks": True},
    "compiled_graphs": {**_KV, "compile_blocks": True, "cuda_graph_max_batch": GRAPH_ANY_BATCH},
    "graphs": {**_KV, "cuda_graph_max_batch": GRAPH_ANY_BATCH},
    "compiled_fp32_attn": {"compile_blocks": True},
    "recipe": recipe_settings()[0],  # toml/sana-image-nft.toml's [custom.rollout.speed]: what its users get
}
DEFAULT_VARIANTS = {
    "cuda": ["eager", "bf16_attn", "text_kv", "compiled", "compiled_graphs"],
    "cpu": ["eager", "bf16_attn", "text_kv"],
}
MAX_PROMPT_LENGTH = 300


@dataclasses.dataclass(frozen=True)
class Case:
    size: int
    batch: int
    cfg: float

    def label(self) -> dict[str, Any]:
        return {"size": self.size, "batch": self.batch, "cfg": self.cfg}


class Bench:
    """The shared pipeline, its three front ends, and the measurement loop."""

    def __init__(self, folder: Path, args: argparse.Namespace) -> None:
        from cosmos_rl.policy.config import DiffusersConfig

        from cosmos_sana.config import ModelOptions
        from cosmos_sana_plugins.sana.model import SanaModel

        self.args = args
        self.device = torch.device(args.device)
        self.model = SanaModel(
            DiffusersConfig(dtype=args.dtype, offload=False, max_prompt_length=MAX_PROMPT_LENGTH),
            model_str=str(folder),
            options=ModelOptions(device=args.device, vae_dtype=args.dtype),
        )
        self.model.transformer.requires_grad_(False).eval()
        self.pipe = self.model.pipeline
        self.pipe.set_progress_bar_config(disable=True)
        self.upstream = upstream_model(self.pipe)
        prompts = [f"a photo of a red fox number {i} in the snow" for i in range(max(args.batches))]
        self.text = self.model.encode_text(prompts)
        self.negative = self.model.negative_text(len(prompts))
        self.rows: list[dict[str, Any]] = []
        self.profile: dict[str, Any] | None = None
        self.flops = {size: self.forward_flops(size) for size in args.sizes}

    # ------------------------------------------------------------------ helpers
    def forward_flops(self, size: int) -> float:
        """FLOPs of one single-image transformer forward at ``size``."""
        from torch.utils.flop_counter import FlopCounterMode

        latents = torch.randn(1, *self.model.latent_shape(size, size), device=self.device)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            self.model.velocity(latents, torch.full((1,), 0.5, device=self.device), self.text.select(slice(0, 1)))
        return float(counter.get_total_flops())

    def generators(self, batch: int) -> list[torch.Generator]:
        from cosmos_sana_plugins.sana.sampling import generators_for

        return generators_for(range(batch), self.device)

    def measure(self, impl: str, case: Case, decode: bool, fn: Any, forwards: bool = True) -> dict[str, Any]:
        reset_peak_memory(self.device)
        seconds = median(time_call(fn, self.device, warmup=self.args.warmup, repeats=self.args.repeats))
        row = {"impl": impl, **case.label(), "decode": decode, "seconds": seconds,
               "images_per_s": case.batch / seconds, "peak_memory_gib": peak_memory_gib(self.device)}
        if forwards:
            cfg_factor = 2 if case.cfg > 1 else 1
            flops = self.flops[case.size] * self.args.steps * cfg_factor * case.batch
            row["transformer_mfu"] = flops / seconds / PEAK_FLOPS
        self.rows.append(row)
        write_json({"bench": "rollout", "partial": True, "results": self.rows}, self.args.json_out, quiet=True)
        print(f"{impl:28s} {case.size:5d}px B={case.batch:<3d} cfg={case.cfg:<4} decode={decode!s:5} "
              f"{row['images_per_s']:8.3f} img/s", flush=True)
        return row

    # ------------------------------------------------------------------ front ends
    def diffusers_call(self, case: Case, decode: bool) -> Any:
        text, negative = self.text.select(slice(0, case.batch)), self.negative.select(slice(0, case.batch))

        def run() -> Any:
            return self.pipe(
                negative_prompt=None, prompt_embeds=text.embeds, prompt_attention_mask=text.mask,
                negative_prompt_embeds=negative.embeds.contiguous(),
                negative_prompt_attention_mask=negative.mask.contiguous(),
                guidance_scale=case.cfg, num_inference_steps=self.args.steps, height=case.size, width=case.size,
                generator=self.generators(case.batch), output_type="pt" if decode else "latent",
                use_resolution_binning=False, complex_human_instruction=None, max_sequence_length=MAX_PROMPT_LENGTH,
            )

        return run

    def upstream_call(self, case: Case, decode: bool) -> Any:
        text, negative = self.text.select(slice(0, case.batch)), self.negative.select(slice(0, case.batch))

        def run() -> Any:
            return self.upstream.pipeline_with_logprob(
                prompt_embeds=text.embeds, prompt_attention_mask=text.mask,
                negative_prompt_embeds=negative.embeds.contiguous(),
                negative_prompt_attention_mask=negative.mask.contiguous(),
                guidance_scale=case.cfg, num_inference_steps=self.args.steps, height=case.size, width=case.size,
                generator=self.generators(case.batch), output_type="pt" if decode else "latent",
                use_resolution_binning=False, max_sequence_length=MAX_PROMPT_LENGTH,
            )

        return run

    def ours_call(self, fast: Any, case: Case, decode: bool) -> Any:
        from cosmos_sana_plugins.sana.sampling import SamplerSettings, sample

        settings = SamplerSettings(
            height=case.size, width=case.size, num_steps=self.args.steps, guidance_scale=case.cfg,
            shift=self.model.default_flow_shift, decode=decode,
        )
        # a fresh view per call: cached text keys/values are computed once per call, as in a rollout
        return lambda: sample(fast, self.text.select(slice(0, case.batch)), self.generators(case.batch), settings)

    def decode_call(self, case: Case) -> Any:
        latents = torch.randn(case.batch, *self.model.latent_shape(case.size, case.size), device=self.device)
        return lambda: self.model.decode_latents(latents)

    # ------------------------------------------------------------------ phases
    def run(self, cases: list[Case], variants: list[str]) -> None:
        from cosmos_sana_plugins.sana import fast_denoise

        decodes = [False] if self.args.no_decode else [False, True]
        with torch.no_grad():
            for case in cases:
                for decode in decodes:
                    if "diffusers" in self.args.baselines:
                        self.measure("diffusers", case, decode, self.diffusers_call(case, decode))
                    if "upstream" in self.args.baselines:
                        self.measure("upstream", case, decode, self.upstream_call(case, decode))
            for variant in variants:
                compiled = VARIANTS[variant].get("compile_blocks", False)
                options = fast_denoise.SpeedOptions(**VARIANTS[variant], compile_vae=self.args.compile_vae and compiled,
                                                    compile_backend=self.args.compile_backend)
                fast_denoise.restore(self.model)
                fast = fast_denoise.accelerate(self.model, options)
                decode_here = not self.args.no_decode and variant in (variants[0], variants[-1])
                for case in cases:
                    self.measure(f"ours/{variant}", case, False, self.ours_call(fast, case, False))
                    if decode_here:
                        self.measure(f"ours/{variant}", case, True, self.ours_call(fast, case, True))
                        if case.cfg == self.args.cfg[0]:  # decoding does not depend on CFG
                            self.measure(f"vae_decode/{variant}", case, True, self.decode_call(case), forwards=False)
                if variant == self.args.profile:
                    self.profile = {"variant": variant, **cases[0].label(),
                                    **profile_top(self.ours_call(fast, cases[0], False), self.device)}
            fast_denoise.restore(self.model)


def upstream_model(pipe: Any) -> Any:
    """cosmos-rl's ``SanaModel`` around ``pipe`` without its loader (see the module docstring)."""
    from cosmos_rl.policy.model.diffusers.sana_model import SanaModel as UpstreamSanaModel

    model = UpstreamSanaModel.__new__(UpstreamSanaModel)
    torch.nn.Module.__init__(model)
    model.pipeline, model.transformer, model.vae, model.scheduler = pipe, pipe.transformer, pipe.vae, pipe.scheduler
    model.is_video = False
    return model


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case and decode flag: best of ours vs each baseline."""
    keys = sorted({(r["size"], r["batch"], r["cfg"], r["decode"]) for r in rows},
                  key=lambda k: (-k[0], -k[1], k[2], k[3]))
    summary = []
    for size, batch, cfg, decode in keys:
        same = [r for r in rows if (r["size"], r["batch"], r["cfg"], r["decode"]) == (size, batch, cfg, decode)]
        ours = [r for r in same if r["impl"].startswith("ours/")]
        if not ours:
            continue
        best = max(ours, key=lambda r: r["images_per_s"])
        base = {r["impl"]: r["images_per_s"] for r in same if not r["impl"].startswith(("ours/", "vae_decode/"))}
        entry = {"size": size, "batch": batch, "cfg": cfg, "decode": decode, "ours_best": best["impl"],
                 "ours_images_per_s": best["images_per_s"], "ours_transformer_mfu": best.get("transformer_mfu")}
        for name, value in base.items():
            entry[f"{name}_images_per_s"] = value
            entry[f"vs_{name}"] = ratio(best["images_per_s"], value)
        summary.append(entry)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="sana-1600m", help="cosmos_sana.tools.tiny preset (random weights)")
    parser.add_argument("--pipeline", help="existing pipeline folder (built here from --preset when missing)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 512])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 1])
    parser.add_argument("--cfg", type=float, nargs="+", default=[1.0], help="guidance scales (1.0 = no CFG)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), help="default: all relevant to the device")
    parser.add_argument("--baselines", nargs="*", choices=["diffusers", "upstream"], default=["diffusers", "upstream"])
    parser.add_argument("--no-decode", action="store_true", help="latents out only")
    parser.add_argument("--compile-vae", action="store_true", help="also compile the VAE decoder in compiled variants")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend of compiled variants")
    parser.add_argument("--profile", choices=sorted(VARIANTS),
                        help="record the top kernels of this variant's first case")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (CPU smoke runs: 1)")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    variants = args.variants or DEFAULT_VARIANTS["cuda" if device.type == "cuda" else "cpu"]
    cases = [Case(size, batch, cfg) for size in args.sizes for batch in args.batches for cfg in args.cfg]
    with tempfile.TemporaryDirectory() as scratch:
        folder = ensure_pipeline(args.pipeline, args.preset, device, DTYPES[args.dtype], Path(scratch))
        bench = Bench(folder, args)
        bench.run(cases, variants)
    result = {
        "bench": "rollout",
        "env": environment(device),
        "config": {**{k: v for k, v in vars(args).items() if k not in ("json_out",)}, "variants": variants,
                   "variant_options": {v: VARIANTS[v] for v in variants}, "peak_flops": PEAK_FLOPS,
                   "text_encoding": "excluded (embeddings precomputed for every implementation)",
                   "upstream_construction": "uninitialised cosmos-rl SanaModel given the shared pipeline's modules"},
        "flops_per_image_forward": {str(size): flops for size, flops in bench.flops.items()},
        "results": bench.rows,
        "summary": summarize(bench.rows),
        "profile": bench.profile,
    }
    write_json(result, args.json_out)


if __name__ == "__main__":
    main()
