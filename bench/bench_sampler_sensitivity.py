"""How much each rollout sampler amplifies a small per-forward change of the velocity (CPU or GPU).

    python bench/bench_sampler_sensitivity.py --preset sana-600m --size 256 --samples 4 --threads 2 --compile \\
        [--pipeline DIR] [--configs nft grpo grpo-ode] [--variants ...] [--no-per-step] --json-out FILE
    python bench/bench_sampler_sensitivity.py --preset tiny --size 64 --threads 1     # ~30 s

Sampler configurations come from the recipes, through the rollout's own ``sampling.sampler_settings``
(``[policy.diffusers.sample]`` and ``[custom.rollout]`` of ``toml/<recipe>.toml``, image size from
``--size``): ``nft`` = ``sana-image-nft`` (ODE, linear σ grid, no CFG), ``grpo`` = ``sana-image-grpo``
(Flow-GRPO SDE, shifted σ grid, CFG, η = ``noise_level``); ``grpo-ode`` = GRPO's grid and CFG with ODE
steps, which separates the SDE from the grid and the guidance.

Variants, each sampled with the same seeds and prompts on the same model (``--dtype`` weights):

* ``baseline`` — no speed feature (diffusers' processors: fp32 linear-attention maths);
* ``bf16_attention`` — ``linear_attention="bf16"``;  ``text_kv`` — ``cache_text_kv`` only;
* ``recipe`` — bf16 attention + text K/V cache (+ compiled blocks with ``--compile``), the set the
  launches compared;
* ``gain_perturbation`` — the baseline with the transformer output multiplied by ``1 + δ·ε``
  (``--delta``, ε a fixed standard-normal tensor of one latent's shape): a benign perturbation of
  known per-forward size that is no part of the speed features;
* ``fp32_reference`` — the same weights in float32 (fp32 maths everywhere): the baseline's own
  distance from it is what the stock bf16 path costs, another benign perturbation.

Per configuration and variant: the relative Frobenius error of the final latents against the baseline
(and of ``baseline``, ``bf16_attention`` and ``recipe`` against ``fp32_reference``), the per-forward
relative error on the first forward (the guided velocity the sampler consumes, and the raw transformer
output of the batch it runs), the same guided per-forward error at every step on the baseline's own path
(off with ``--no-per-step``), and the amplification = final-latent error / first-forward guided error.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchlib import DTYPES, environment, ensure_pipeline, write_json

REPO = Path(__file__).resolve().parent.parent
MAX_PROMPT_LENGTH = 300
#: configuration name → (recipe, overrides of its ``[custom.rollout]`` table)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "nft": ("sana-image-nft", {}),
    "grpo": ("sana-image-grpo", {}),
    "grpo-ode": ("sana-image-grpo", {"sampler": "ode"}),
}
VARIANTS = ("baseline", "bf16_attention", "text_kv", "gain_perturbation", "recipe", "fp32_reference")
PROMPTS = ["a red fox in the snow", "a lighthouse on a cliff at dusk", "a bowl of ramen, top view",
           "an astronaut riding a horse"]


def relative(result: torch.Tensor, reference: torch.Tensor) -> float:
    """``‖result − reference‖_F / ‖reference‖_F`` in float64."""
    result, reference = result.double(), reference.double()
    return ((result - reference).norm() / reference.norm()).item()


def recipe_sampler_settings(name: str, model: Any, size: int) -> Any:
    """``SamplerSettings`` of configuration ``name`` as the ``sana`` rollout derives them (no decode)."""
    from cosmos_rl.policy.config import SampleConfig

    from cosmos_sana.config.recipe_file import read_toml
    from cosmos_sana_plugins.sana.sampling import sampler_settings

    recipe, overrides = CONFIGS[name]
    raw = read_toml(REPO / "toml" / f"{recipe}.toml")
    rollout = {k: v for k, v in raw["custom"].get("rollout", {}).items() if k != "speed"}
    config = SimpleNamespace(
        policy=SimpleNamespace(diffusers=SimpleNamespace(
            inference_size=[size, size], train_frames=1, inference_frames=1,
            sample=SampleConfig(**raw["policy"]["diffusers"]["sample"]))),
        custom={"package": "cosmos-sana", "rollout": {**rollout, **overrides}},
    )
    return dataclasses.replace(sampler_settings(config, model), decode=False)


class GainPerturbed:
    """``model`` whose velocity is multiplied by ``1 + delta·eps`` (``eps`` broadcast over the batch)."""

    def __init__(self, model: Any, eps: torch.Tensor, delta: float) -> None:
        self.model, self.gain = model, 1 + delta * eps

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def velocity(self, latents: torch.Tensor, sigmas: torch.Tensor, text: Any) -> torch.Tensor:
        return self.model.velocity(latents, sigmas, text) * self.gain


class Bench:
    def __init__(self, folder: Path, args: argparse.Namespace) -> None:
        from cosmos_rl.policy.config import DiffusersConfig

        from cosmos_sana.config import ModelOptions
        from cosmos_sana_plugins.sana.model import SanaModel

        self.args = args
        self.model = SanaModel(
            DiffusersConfig(dtype=args.dtype, offload=False, max_prompt_length=MAX_PROMPT_LENGTH),
            model_str=str(folder), options=ModelOptions(device=args.device, vae_dtype=args.dtype),
        )
        self.model.transformer.requires_grad_(False).eval()
        self.text = self.model.encode_text([PROMPTS[i % len(PROMPTS)] for i in range(args.samples)])
        self.settings = {name: recipe_sampler_settings(name, self.model, args.size) for name in args.configs}
        shape = self.model.latent_shape(args.size, args.size)
        self.eps = torch.randn((1, *shape), generator=torch.Generator().manual_seed(1234)).to(args.device)
        self.runs: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in args.configs}

    def run_variant(self, variant: str, view: Any) -> None:
        """Sample every configuration through ``view``; keep final latents and per-forward velocities."""
        from cosmos_sana_plugins.sana.sampling import GuidedDenoiser, generators_for, sample

        for name, settings in self.settings.items():
            began = time.perf_counter()
            out = sample(view, self.text, generators_for(range(self.args.samples), self.args.device), settings)
            seconds = time.perf_counter() - began
            path = self.runs[name]["baseline"]["path"] if "baseline" in self.runs[name] else out.trajectory.latents
            sigmas = out.trajectory.sigmas
            denoiser = GuidedDenoiser(view, self.text, None, settings.guidance_scale)
            guided, raw = [], None
            with torch.no_grad():
                for i in range(path.shape[1] - 1 if self.args.per_step else 1):
                    x = path[:, i]
                    guided.append(denoiser(x, sigmas[i]))
                    if i == 0:  # the batch the transformer runs: [uncond; cond] with CFG
                        batch = torch.cat([x, x]) if denoiser.guided else x
                        raw = view.velocity(batch, sigmas[0].expand(batch.shape[0]), denoiser.text)
            self.runs[name][variant] = {"final": out.latents, "path": out.trajectory.latents, "guided": guided,
                                        "raw": raw, "sigmas": sigmas.tolist(), "seconds": seconds}
            print(f"{variant:18s} {name:9s} {seconds:7.1f} s", flush=True)

    def run(self) -> None:
        from cosmos_sana_plugins.sana import fast_denoise
        from cosmos_sana_plugins.sana.fast_denoise import SpeedOptions

        model = self.model
        speed = {
            "baseline": SpeedOptions(),
            "bf16_attention": SpeedOptions(linear_attention="bf16"),
            "text_kv": SpeedOptions(cache_text_kv=True),
            "recipe": SpeedOptions(linear_attention="bf16", cache_text_kv=True, compile_blocks=self.args.compile),
        }
        for variant in self.args.variants:  # in VARIANTS order: fp32_reference, which casts the model, last
            fast_denoise.restore(model)
            if variant in speed:
                self.run_variant(variant, fast_denoise.accelerate(model, speed[variant]))
            elif variant == "gain_perturbation":
                self.run_variant(variant, GainPerturbed(model, self.eps, self.args.delta))
            else:
                model.transformer.to(torch.float32)  # bf16 → fp32 is exact: the same weights, fp32 maths
                self.run_variant(variant, model)
        fast_denoise.restore(model)

    def compare(self, name: str, variant: str, reference: str) -> dict[str, Any]:
        run, ref = self.runs[name][variant], self.runs[name][reference]
        final = relative(run["final"], ref["final"])
        first = relative(run["guided"][0], ref["guided"][0])
        entry = {
            "final_latents_relative": final,
            "final_latents_max_abs": (run["final"] - ref["final"]).abs().max().item(),
            "first_forward_relative": first,
            "first_forward_raw_relative": relative(run["raw"], ref["raw"]),
            "amplification": final / first if first > 0 else None,
        }
        if self.args.per_step:  # every variant's velocities are evaluated on the baseline's path
            per_step = [relative(a, b) for a, b in zip(run["guided"], ref["guided"], strict=True)]
            entry["per_step_forward_relative"] = per_step
            mean = sum(per_step) / len(per_step)
            entry["mean_forward_relative"] = mean
            entry["amplification_of_mean"] = final / mean if mean > 0 else None
        return entry

    def report(self) -> dict[str, Any]:
        result = {}
        for name, settings in self.settings.items():
            runs = self.runs[name]
            result[name] = {
                "recipe": CONFIGS[name][0],
                "settings": {k: getattr(settings, k) for k in
                             ("num_steps", "sampler", "eta", "guidance_scale", "shift", "height", "width")},
                "sigmas": [round(s, 6) for s in runs["baseline"]["sigmas"]],
                "final_latents_norm_rms": runs["baseline"]["final"].pow(2).mean().sqrt().item(),
                "seconds": {v: r["seconds"] for v, r in runs.items()},
                "vs_baseline": {v: self.compare(name, v, "baseline") for v in runs if v != "baseline"},
                "vs_fp32_reference": {v: self.compare(name, v, "fp32_reference")
                                      for v in ("baseline", "bf16_attention", "recipe")
                                      if v in runs and "fp32_reference" in runs},
            }
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", help="cosmos_sana.tools.tiny preset (random weights)")
    parser.add_argument("--pipeline", help="existing pipeline folder (built there from --preset when missing)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16", help="weights of the model")
    parser.add_argument("--size", type=int, default=64, help="image size (square)")
    parser.add_argument("--samples", type=int, default=2, help="samples per rollout (seeds 0..samples-1)")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS[1:], default=list(VARIANTS[1:]),
                        help="besides the baseline, which always runs")
    parser.add_argument("--delta", type=float, default=1e-3, help="size of the gain perturbation")
    parser.add_argument("--compile", action="store_true", help="compiled blocks in the recipe variant")
    parser.add_argument("--no-per-step", dest="per_step", action="store_false",
                        help="measure the per-forward error on the first forward only")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.variants = [v for v in VARIANTS if v == "baseline" or v in args.variants]
    device = torch.device(args.device)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = ensure_pipeline(args.pipeline, args.preset, device, DTYPES[args.dtype], Path(scratch))
        bench = Bench(folder, args)
        bench.run()
        configs = bench.report()
    result = {
        "bench": "sampler_sensitivity",
        "env": environment(device),
        "config": {**{k: v for k, v in vars(args).items() if k != "json_out"},
                   "gain_perturbation": f"velocity x (1 + {args.delta}·eps), eps ~ N(0, 1) fixed (seed 1234), "
                                        "one latent's shape, the same for every row and step"},
        "configs": configs,
        "wall_s": time.perf_counter() - began,
    }
    write_json(result, args.json_out)


if __name__ == "__main__":
    main()
