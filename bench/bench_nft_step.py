"""Diffusion-NFT training step: our trainer vs upstream cosmos-rl's NFTTrainer loss path, same batch.

    python bench/bench_nft_step.py --preset sana-1600m --device cuda --dtype bfloat16 \\
        --size 1024 --batch 8 --lora-rank 32 [--timesteps 6] [--pipeline DIR] --json-out FILE
    python bench/bench_nft_step.py --preset tiny --device cpu --size 64 --batch 4 --lora-rank 4 \\
        --timesteps 1 --threads 1 --variants plain         # smoke

One timed step = ``timesteps`` iterations of the NFT pattern (old and reference forwards
without grad, policy forward + backward) over ``batch`` samples, one optimizer step and the
``old`` update. samples/s = batch·timesteps / seconds; MFU = FLOPs of the pattern
(``FlopCounterMode`` over one iteration, backward included, recompute not counted) / time / 790e12.

* ``upstream`` — cosmos-rl 0.4.7 ``NFTTrainer.step_training``'s loss path, reproduced (its class
  needs a process group, CUDA streams and a full cosmos-rl launch): PEFT ``set_adapter`` /
  ``disable_adapters`` switching, its loss and metrics, its text-mask argument. One deviation:
  the noised latents are cast to the transformer dtype (upstream passes fp32 latents to a bf16
  model, which its conv patch embedding rejects). It runs on our trainer's transformer, so with
  toml/sana-image-nft.toml's gradient-checkpointing setting (upstream's own recipe turns it on).
* ``ours/<variant>`` — our registered ``sana_nft`` trainer's ``step_training`` on rollouts built
  from the same tensors: ``plain`` as configured, ``fast`` with ``fast_denoise`` (bf16 linear
  attention, compiled blocks), ``fast_checkpointing`` plus gradient checkpointing, ``recipe`` what
  toml/sana-image-nft.toml sets (its speed table and its gradient checkpointing).

Prints one JSON object (rewritten to ``--json-out`` after each variant).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench_adapter_switching import upstream_iteration
from benchlib import (
    DTYPES, PEAK_FLOPS, RECIPE, environment, ensure_pipeline, median, peak_memory_gib, ratio, recipe_settings,
    reset_peak_memory, time_call, write_json,
)

GRID_STEPS = 10
GROUP = 4  # samples per prompt
RECIPE_SPEED, RECIPE_CHECKPOINTING = recipe_settings()
VARIANTS = {
    "plain": {},
    "fast": {"linear_attention": "bf16", "compile_blocks": True},
    "fast_checkpointing": {"linear_attention": "bf16", "compile_blocks": True},
    "recipe": RECIPE_SPEED,  # toml/sana-image-nft.toml's speed table, with its gradient checkpointing setting
}
BASELINE = "upstream NFTTrainer loss path, reproduced"


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *path, last = dotted.split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


def build_trainer(folder: Path, out: Path, args: argparse.Namespace) -> Any:
    """Our ``sana_nft`` trainer from toml/sana-image-nft.toml (its optimizer, EMA and loss settings), on one
    device at the bench's shapes. The tiny recipe's learning rate (1e-2, for a demo that moves in dozens of
    steps) drives the repeated bench step on a 1600M model to non-finite gradients by its third call."""
    from cosmos_rl.policy.trainer.base import TrainerRegistry
    from cosmos_rl.utils.parallelism import ParallelDims

    from cosmos_sana.compat.cosmos_rl import cosmos_config_class, register_all
    from cosmos_sana.config.recipe_file import read_toml
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana_plugins.datasets.packer import SanaDataPacker

    data = read_toml(RECIPE)
    overrides = {
        "policy.model_name_or_path": str(folder),
        "policy.diffusers.dtype": args.dtype,
        "policy.diffusers.max_prompt_length": args.max_prompt_length,
        "policy.diffusers.inference_size": [args.size, args.size],
        "policy.diffusers.sample.num_steps": GRID_STEPS,
        "policy.diffusers.timesteps_fraction": args.timesteps / GRID_STEPS,
        "policy.lora.r": args.lora_rank,
        "policy.lora.lora_alpha": 2 * args.lora_rank,
        "train.output_dir": str(out),
        "train.timestamp": "bench",
        "train.param_dtype": args.dtype,
        "train.ckpt.enable_checkpoint": False,
        "train.train_batch_per_replica": args.batch,
        "train.train_policy.mini_batch": args.batch,
        "train.train_policy.batch_size_per_optimize": args.batch,
        "train.train_policy.mu_iterations": 1,
        "train.train_policy.kl_beta": 1e-4,
        "rollout.n_generation": GROUP,
        "rollout.n_generation_mini_batch": GROUP,
        "policy.parallelism.dp_shard_size": 1,
        "rollout.parallelism.dp_shard_size": 1,
        "logging.logger": ["console"],
        "custom.logging": {"progress_bar": False},
        "custom.model.device": args.device,
        "custom.model.vae_dtype": args.dtype,
    }
    for key, value in overrides.items():
        set_key(data, key, value)
    config = cosmos_config_class().from_dict(data)
    register_all(installed_plugins())
    packer = SanaDataPacker()
    packer.setup(config)
    cls = TrainerRegistry.get_trainer_cls(config.train.train_policy.trainer_type)
    return cls(config, ParallelDims.from_config(config.policy.parallelism), data_packer=packer, val_data_packer=packer)


def make_rollouts(trainer: Any, batch: int, size: int) -> list[Any]:
    """``batch`` rollouts (``batch / 4`` prompts × 4) as our rollout backend hands them over."""
    from cosmos_rl.dispatcher.data.schema import Rollout

    from cosmos_sana_plugins.sana.sampling import sigma_grid

    model, device = trainer.model, trainer.device
    g = torch.Generator(device="cpu").manual_seed(0)
    prompts = [f"a photo of a red fox number {i // GROUP} in the snow" for i in range(batch)]
    text = model.encode_text(prompts)
    latents = torch.randn(batch, *model.latent_shape(size, size), generator=g).to(device)
    sigmas = sigma_grid(GRID_STEPS, device=device)
    rewards = torch.rand(batch, generator=g).tolist()
    return [
        Rollout(
            prompt={"prompt": prompts[i], "metadata": {}}, prompt_idx=i // GROUP, completion="", reward=rewards[i],
            extra_info={"x0": latents[i], "sigmas": sigmas, "text_embeds": text.embeds[i], "text_mask": text.mask[i]},
            report_metrics={},
        )
        for i in range(batch)
    ]


class UpstreamNFT:
    """cosmos-rl 0.4.7 ``NFTTrainer.step_training`` (one optimize batch, ``mu_iterations`` 1), reproduced."""

    def __init__(self, trainer: Any, rollouts: list[Any], timesteps: int) -> None:
        from cosmos_sana_plugins.trainers import losses

        self.trainer, self.model = trainer, trainer.model
        self.transformer = trainer.model.transformer
        self.config = trainer.config
        self.timesteps = timesteps
        device = trainer.device
        infos = [r.extra_info for r in rollouts]
        self.x0 = torch.stack([i["x0"] for i in infos]).to(device)
        self.embeds = torch.stack([i["text_embeds"] for i in infos]).to(device)
        self.mask = torch.stack([i["text_mask"] for i in infos]).to(device)
        grid = torch.stack([i["sigmas"] for i in infos]).to(device)
        self.grid_timesteps = grid[:, :-1] * 1000  # the scheduler timesteps upstream's rollout stores
        rewards = torch.tensor([r.reward for r in rollouts], device=device)
        groups = torch.tensor([r.prompt_idx for r in rollouts], device=device)
        self.advantages = losses.group_advantages(rewards, groups, global_std=True)
        self.params = {n: [p for _, p in sorted(lora_params(self.transformer, n).items())] for n in ("default", "old")}

    def iteration(self, x0: torch.Tensor, embeds: torch.Tensor, mask: torch.Tensor, timestep: torch.Tensor,
                  advantages: torch.Tensor, scale: float) -> None:
        """Old, policy and reference forwards, the NFT loss, its metrics and backward (upstream order)."""
        cfg, tp = self.config.policy.diffusers, self.config.train.train_policy
        transformer, dtype = self.transformer, self.transformer.dtype
        t = timestep / 1000.0
        t_expanded = t.view(-1, *([1] * (x0.ndim - 1)))
        noise = torch.randn_like(x0.float())
        xt = (1 - t_expanded) * x0 + t_expanded * noise
        inputs = {"hidden_states": xt.to(dtype), "encoder_hidden_states": embeds, "attention_mask": mask,
                  "timestep": timestep, "return_dict": False, "attention_kwargs": None}
        transformer.set_adapter("old")
        with torch.no_grad():
            old = transformer(**inputs)[0].detach()
        transformer.set_adapter("default")
        forward = transformer(**inputs)[0]
        with torch.no_grad():
            transformer.disable_adapters()
            ref = transformer(**inputs)[0]
            transformer.enable_adapters()
            transformer.set_adapter("default")
        clipped = torch.clamp(advantages, tp.advantage_low, tp.advantage_high)
        r = torch.clamp(clipped / tp.advantage_high / 2.0 + 0.5, 0, 1)
        beta = cfg.nft_beta
        positive = beta * forward + (1 - beta) * old.detach()
        negative = (1.0 + beta) * old.detach() - beta * forward
        dims = tuple(range(1, x0.ndim))
        x0_pos = xt - t_expanded * positive
        with torch.no_grad():
            w_pos = torch.abs(x0_pos.double() - x0.double()).mean(dim=dims, keepdim=True).clip(min=0.00001)
        pos_loss = ((x0_pos - x0) ** 2 / w_pos).mean(dim=dims)
        x0_neg = xt - t_expanded * negative
        with torch.no_grad():
            w_neg = torch.abs(x0_neg.double() - x0.double()).mean(dim=dims, keepdim=True).clip(min=0.00001)
        neg_loss = ((x0_neg - x0) ** 2 / w_neg).mean(dim=dims)
        policy = ((r * pos_loss / beta + (1.0 - r) * neg_loss / beta) * tp.advantage_high).mean()
        kl = ((forward - ref) ** 2).mean(dim=dims).mean()
        loss = policy + tp.kl_beta * kl
        (loss * scale).backward()
        with torch.no_grad():  # upstream's per-iteration report terms
            x0_sq = x0**2
            dev = (forward - old) ** 2
            torch.stack([x0_sq.mean(), x0_sq.max(), dev.mean(), dev.max(),
                         ((old - ref) ** 2).mean(dim=dims).mean(), loss.detach(), policy.detach(), kl.detach()])

    def step(self, step_index: int = 1) -> None:
        from cosmos_rl.policy.trainer.diffusers_trainer.nft_trainer import get_weight_copy_decay
        from cosmos_rl.utils.util import copy_weights_with_decay

        device, batch = self.x0.device, self.x0.shape[0]
        self.transformer.train()
        perm = torch.randperm(batch, device=device)
        x0, embeds, mask = self.x0[perm], self.embeds[perm], self.mask[perm]
        advantages, timesteps = self.advantages[perm], self.grid_timesteps[perm]
        perms_time = torch.stack([torch.randperm(timesteps.shape[1], device=device) for _ in range(batch)])
        timesteps = timesteps[torch.arange(batch, device=device)[:, None], perms_time]
        with torch.enable_grad():
            for j in range(self.timesteps):
                self.iteration(x0, embeds, mask, timesteps[:, j], advantages, 1.0 / self.timesteps)
        clip = self.config.train.optm_grad_norm_clip
        torch.nn.utils.clip_grad_norm_(self.params["default"], clip, foreach=True)
        self.trainer.optimizers.step()
        self.trainer.optimizers.zero_grad()
        decay = get_weight_copy_decay(step_index, self.config.policy.diffusers.weight_copy_decay_type)
        with torch.no_grad():
            copy_weights_with_decay(src_params=self.params["default"], tgt_params=self.params["old"], decay=decay)

    def iteration_flops(self) -> float:
        """FLOPs of one 3-forward + 1-backward iteration over the batch (counted, not modelled), with
        gradient checkpointing off while counting: its recomputed forward is not useful work."""
        from torch.utils.flop_counter import FlopCounterMode

        checkpointing = self.transformer.is_gradient_checkpointing
        self.transformer.disable_gradient_checkpointing()
        self.transformer.train()
        try:
            with torch.enable_grad(), FlopCounterMode(display=False) as counter:
                self.iteration(self.x0, self.embeds, self.mask, self.grid_timesteps[:, 0], self.advantages, 1.0)
            self.trainer.optimizers.zero_grad()
        finally:
            if checkpointing:
                self.transformer.enable_gradient_checkpointing()
        return float(counter.get_total_flops())


def switching_ms(trainer: Any, repeats: int = 5) -> dict[str, float]:
    """Host milliseconds of one iteration's adapter switching: ours (old and reference views in
    and out) vs upstream's ``set_adapter`` / ``disable_adapters`` sequence."""
    model, transformer = trainer.model, trainer.model.transformer
    trained = model.trainable_adapter

    def ours() -> None:
        for name in ("old", trained, None, trained):
            model.use_adapter(name)

    result = {}
    for name, fn in (("ours", ours), ("upstream", lambda: upstream_iteration(transformer))):
        fn()
        began = time.perf_counter()
        for _ in range(repeats):
            fn()
        result[name] = (time.perf_counter() - began) / repeats * 1000
    model.use_adapter(trained)
    return result


def lora_params(transformer: torch.nn.Module, adapter: str) -> dict[str, torch.nn.Parameter]:
    from cosmos_sana_plugins.sana.lora import adapter_parameters

    return adapter_parameters(transformer, adapter)


def measure(
    name: str, fn: Any, device: torch.device, args: argparse.Namespace, flops_per_step: float,
    reported_peaks: list[float] | None = None,
) -> dict[str, Any]:
    """One row; ``reported_peaks`` collects the peak memory ``fn`` reports per call (the timed calls'
    largest is kept), for a step that resets the device's peak counter itself, as our trainer does
    after logging ``memory/peak_gib``."""
    reset_peak_memory(device)
    seconds = median(time_call(fn, device, warmup=args.warmup, repeats=args.repeats))
    samples = args.batch * args.timesteps
    peak = max(reported_peaks[-args.repeats:]) if reported_peaks else peak_memory_gib(device)
    row = {"impl": name, "seconds_per_step": seconds, "samples_per_s": samples / seconds,
           "mfu": flops_per_step / seconds / PEAK_FLOPS, "peak_memory_gib": peak}
    print(f"{name:28s} {row['samples_per_s']:8.2f} samples/s  MFU {row['mfu']:.3f}  "
          f"peak {row['peak_memory_gib']} GiB", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="sana-1600m")
    parser.add_argument("--pipeline", help="existing pipeline folder (built here from --preset when missing)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8, help="samples per step (multiple of 4: prompts × 4)")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--timesteps", type=int, default=6, help="grid steps trained per sample and step (of 10)")
    parser.add_argument("--max-prompt-length", type=int, default=300)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the fast variants")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch % GROUP or not 1 <= args.timesteps <= GRID_STEPS:
        parser.error(f"--batch must be a multiple of {GROUP} and --timesteps in [1, {GRID_STEPS}]")
    from cosmos_sana_plugins.sana import fast_denoise

    device = torch.device(args.device)
    result: dict[str, Any] = {"bench": "nft_step", "env": environment(device), "baseline": BASELINE,
                              "config": {k: v for k, v in vars(args).items() if k != "json_out"}, "results": []}
    with tempfile.TemporaryDirectory() as scratch:
        folder = ensure_pipeline(args.pipeline, args.preset, device, DTYPES[args.dtype], Path(scratch))
        trainer = build_trainer(folder, Path(scratch) / "out", args)
        rollouts = make_rollouts(trainer, args.batch, args.size)
        upstream = UpstreamNFT(trainer, rollouts, args.timesteps)
        flops_per_step = upstream.iteration_flops() * args.timesteps
        result["flops_per_sample_iteration"] = flops_per_step / args.timesteps / args.batch
        result["adapter_switching_ms_per_iteration"] = switching_ms(trainer)
        if not args.no_baseline:
            result["results"].append(measure("upstream", upstream.step, device, args, flops_per_step))
            write_json(result, args.json_out, quiet=True)
        transformer = trainer.model.transformer
        for variant in args.variants:
            torch._dynamo.reset()  # each variant compiles afresh, as in its own launch (no recompile limit hit)
            fast_denoise.restore(trainer.model)
            transformer.disable_gradient_checkpointing()
            options = fast_denoise.SpeedOptions(**VARIANTS[variant], compile_backend=args.compile_backend)
            fast_denoise.accelerate(trainer.model, options)
            if variant.endswith("checkpointing") or (variant == "recipe" and RECIPE_CHECKPOINTING):
                transformer.enable_gradient_checkpointing()
            counter = iter(range(1, 10**6))
            peaks: list[float] = []

            def step() -> None:
                report = trainer.step_training(rollouts, next(counter), 10**6)
                if "memory/peak_gib" in report:
                    peaks.append(report["memory/peak_gib"])

            row = measure(f"ours/{variant}", step, device, args, flops_per_step, peaks)
            result["results"].append(row)
            write_json(result, args.json_out, quiet=True)
        fast_denoise.restore(trainer.model)
        transformer.disable_gradient_checkpointing()
    rows = {r["impl"]: r for r in result["results"]}
    base = rows.get("upstream")
    if base:
        for row in result["results"]:
            row["speedup_vs_upstream"] = ratio(row["samples_per_s"], base["samples_per_s"])
            row["memory_vs_upstream"] = ratio(row["peak_memory_gib"], base["peak_memory_gib"])
    write_json(result, args.json_out)


if __name__ == "__main__":
    main()
