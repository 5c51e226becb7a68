"""Host time of one Diffusion-NFT iteration's LoRA adapter switching, at real transformer shapes.

    python bench/bench_adapter_switching.py --preset sana-1600m --dtype bfloat16 --device cpu --lora-rank 32
    python bench/bench_adapter_switching.py --preset tiny --repeats 5          # smoke

One iteration switches ``old`` → trainable → base model (KL reference) → trainable, as the NFT
trainer's policy views do (``SanaModel.use_adapter``, i.e. ``lora.activate``). Rows:

* ``activate`` — ``cosmos_sana_plugins.sana.lora.activate`` as it is now;
* ``peft_per_layer`` — what ``activate`` did before its layers were cached: walk every module and, on
  each PEFT layer, ``enable_adapters`` and ``set_adapter``, then set every adapter tensor's
  ``requires_grad``;
* ``upstream`` — cosmos-rl 0.4.7's NFT trainer sequence: diffusers ``set_adapter`` / ``disable_adapters``
  / ``enable_adapters`` on the whole transformer.

Only the transformer is built (random weights; ``--device meta`` builds no storage at all: the
switching touches flags, never tensor data). Rounds alternate the rows; each row's number is the
median over rounds of the mean milliseconds per iteration. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from benchlib import DTYPES, environment, median, ratio, write_json

SEQUENCE = ("old", "default", None, "default")  # one NFT iteration: old view, policy, reference view, policy


def peft_per_layer(transformer: torch.nn.Module, active: str | None, trainable: str | None) -> None:
    """``activate`` before its layers were cached: PEFT's own calls on every layer, every time."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if active is not None and active not in transformer.peft_config:
        raise ValueError(f"unknown adapter {active!r}; adapters are {list(transformer.peft_config)}")
    for layer in transformer.modules():
        if not isinstance(layer, BaseTunerLayer):
            continue
        layer.enable_adapters(active is not None)
        if active is not None:
            layer.set_adapter(active)
        for layer_name in layer.adapter_layer_names:
            for name, item in getattr(layer, layer_name).items():
                item.requires_grad_(name == trainable)


def upstream_iteration(transformer: torch.nn.Module) -> None:
    """One iteration of cosmos-rl 0.4.7's NFT trainer switching: diffusers ``set_adapter`` /
    ``disable_adapters`` / ``enable_adapters`` on the whole transformer."""
    transformer.set_adapter("old")
    transformer.set_adapter("default")
    transformer.disable_adapters()
    transformer.enable_adapters()
    transformer.set_adapter("default")


def build(preset: str, device: str, dtype: torch.dtype, rank: int) -> torch.nn.Module:
    from cosmos_sana.tools.tiny import build_transformer
    from cosmos_sana.tools.tiny_presets import PRESETS
    from cosmos_sana_plugins.sana.lora import add_adapters

    with torch.device(device):
        transformer = build_transformer(PRESETS[preset]).to(dtype)
        lora = SimpleNamespace(r=rank, lora_alpha=float(rank), lora_dropout=0.0, target_modules=None,
                               init_lora_weights="gaussian", use_rslora=False, r_pattern=None, alpha_pattern=None,
                               lora_names=["default", "old"])
        add_adapters(transformer, lora)
    return transformer


def rows(transformer: torch.nn.Module) -> dict[str, Callable[[], None]]:
    from cosmos_sana_plugins.sana.lora import activate

    def switch_with(fn: Callable[[torch.nn.Module, str | None, str | None], None]) -> Callable[[], None]:
        def iteration() -> None:
            for name in SEQUENCE:
                fn(transformer, name, "default")
        return iteration

    return {"activate": switch_with(activate), "peft_per_layer": switch_with(peft_per_layer),
            "upstream": lambda: upstream_iteration(transformer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="sana-1600m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20, help="iterations per row per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json-out")
    args = parser.parse_args()

    began = time.perf_counter()
    transformer = build(args.preset, args.device, DTYPES[args.dtype], args.lora_rank)
    from cosmos_sana_plugins.sana.lora import _tuner_layers

    result: dict[str, Any] = {
        "bench": "adapter_switching",
        "env": environment(torch.device(args.device)),
        "config": {k: v for k, v in vars(args).items() if k != "json_out"}, "sequence": list(SEQUENCE),
        "modules": sum(1 for _ in transformer.modules()),
        "lora_layers": sum(1 for _ in _tuner_layers(transformer)),
        "build_s": time.perf_counter() - began,
    }
    timed = rows(transformer)
    samples: dict[str, list[float]] = {name: [] for name in timed}
    for fn in timed.values():
        fn()  # warm-up (and the one walk that finds the LoRA layers)
    for _ in range(args.rounds):
        for name, fn in timed.items():
            start = time.perf_counter()
            for _ in range(args.repeats):
                fn()
            samples[name].append((time.perf_counter() - start) / args.repeats * 1000)
    result["ms_per_iteration"] = {name: median(values) for name, values in samples.items()}
    ms = result["ms_per_iteration"]
    result["speedup_vs_peft_per_layer"] = ratio(ms["peft_per_layer"], ms["activate"])
    result["speedup_vs_upstream"] = ratio(ms["upstream"], ms["activate"])
    write_json(result, args.json_out)


if __name__ == "__main__":
    main()
