"""Reward scoring throughput per scorer, and how much scoring overlaps a (simulated) rollout.

    python bench/bench_rewards.py [--device cuda:0] [--batch 8] [--size 512] [--json-out FILE] \
        [--reward pickscore --reward-args 'pickscore:{"model": "/models/PickScore_v1"}' ...]

Without ``--reward-args`` a model-based scorer runs on tiny random weights (real
architecture, toy width): that measures the pipeline, not the real model. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_REWARDS = ["jpeg_compressibility", "ocr", "clipscore", "pickscore", "aesthetic", "hpsv2.1", "imagereward"]


def throughput(name: str, args: dict, registry: Any, device: str, batch: int, size: int, repeats: int) -> dict:
    import torch

    from cosmos_sana.config import RewardRef
    from cosmos_sana.rewards.scorers import ScorerSet

    scorers = ScorerSet.build([RewardRef(name=name, args=args)], registry, device=device)
    media = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(0)).to(device)
    prompts = ['a shop sign that says "hello"'] * batch
    scorers.score(media, prompts)  # warm-up (lazy init, kernels)
    start = time.perf_counter()
    for _ in range(repeats):
        scorers.score(media, prompts)
    seconds = (time.perf_counter() - start) / repeats
    return {"images_per_s": batch / seconds, "seconds_per_batch": seconds, "batch": batch, "size": size}


class SleepScorer:
    """A scorer that takes ``seconds`` per batch (GIL released, like GPU work) and logs when it ran."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.intervals = seconds, []

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        start = time.perf_counter()
        time.sleep(self.seconds)
        self.intervals.append((start, time.perf_counter()))
        return [0.0] * media.shape[0]


def overlap(rollout_s: float, score_s: float, steps: int) -> dict:
    """Rollout (sleep) → submit; collect the previous step's scores; measure the overlap."""
    import torch

    from cosmos_sana.config import RewardRef
    from cosmos_sana.rewards.scheduler import RewardScheduler
    from cosmos_sana.rewards.scorers import Scorer, ScorerSet
    from cosmos_sana.specs import RewardSpec

    slow = SleepScorer(score_s)
    scorer = Scorer(RewardRef(name="slow"), RewardSpec(name="slow", target=slow), slow)
    rollouts: list[tuple[float, float]] = []
    media = torch.rand(2, 3, 8, 8)
    start = time.perf_counter()
    with RewardScheduler(ScorerSet([scorer]), workers=1) as scheduler:
        for step in range(steps):
            t0 = time.perf_counter()
            time.sleep(rollout_s)
            rollouts.append((t0, time.perf_counter()))
            scheduler.submit(step, [(step, 0), (step, 1)], media, ["", ""])
            if step:
                scheduler.collect(step - 1)
        scheduler.collect(steps - 1)
    wall = time.perf_counter() - start
    scoring = sum(b - a for a, b in slow.intervals)
    shared = sum(max(0.0, min(b, d) - max(a, c)) for a, b in slow.intervals for c, d in rollouts)
    return {
        "rollout_s": rollout_s, "score_s": score_s, "steps": steps, "wall_s": wall,
        "serial_s": steps * (rollout_s + score_s), "speedup": steps * (rollout_s + score_s) / wall,
        "overlap_fraction": shared / scoring,
        # the last step's scoring has no rollout after it to overlap with
        "ideal_overlap_fraction": min(1.0, rollout_s / score_s) * (steps - 1) / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reward", action="append", default=[], help=f"default: {' '.join(DEFAULT_REWARDS)}")
    parser.add_argument("--reward-args", action="append", default=[], metavar="NAME:JSON")
    parser.add_argument("--rollout-s", type=float, default=0.2, help="simulated rollout time per step")
    parser.add_argument("--slowdown", type=float, default=1.5, help="scoring time = slowdown × rollout time")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json-out")
    options = parser.parse_args()

    from benchlib import write_json

    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.rewards.selection import parse_reward_args
    from cosmos_sana_plugins.rewards.tiny import tiny_reward_args

    given = dict(parse_reward_args(a) for a in options.reward_args)
    names = options.reward or DEFAULT_REWARDS
    results: dict[str, Any] = {"bench": "rewards", "device": options.device, "throughput": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = tiny_reward_args(Path(tmp), [n for n in names if n not in given])
        for name in names:
            args = given.get(name, tiny.get(name, {}))
            row = throughput(name, args, installed_plugins(), options.device, options.batch, options.size,
                             options.repeats)
            row["weights"] = "given" if name in given else ("tiny-random" if name in tiny else "none")
            results["throughput"][name] = row
    if "ocr" in names:  # what each Tesseract worker runs with (its default, or this environment's)
        results["ocr_omp_thread_limit"] = os.environ.get("OMP_THREAD_LIMIT", "1")
    results["overlap"] = overlap(options.rollout_s, options.rollout_s * options.slowdown, options.steps)
    write_json(results, options.json_out)


if __name__ == "__main__":
    main()
