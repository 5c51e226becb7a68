"""How much reward scoring hides behind rollout generation in the real ``sana`` rollout + scheduler path.

    python bench/bench_reward_overlap.py [--recipe toml/tiny/sana-image-grpo.toml] [--steps 3] \
        [--mini-batch 2] [--score-ratio 1.0] [--json out.json]

Per step: one ``rollout_generation`` call (``[rollout] batch_size`` prompts × ``n_generation``,
sampled ``--mini-batch`` at a time), then the reward function cosmos-rl gets, called as
cosmos-rl calls it for every payload. The only reward is an artificially slow scorer that
sleeps ``--score-ratio`` × (measured generation time per sample) per sample, so scoring
costs as much as generating when the ratio is 1. Runs ``mode = "sync"`` (inline scoring)
and ``"async"`` (chunks submitted while the next ones generate) on a fresh ``tiny`` pipeline.

``hidden_fraction``: the share of scoring time that ran while the rollout was generating;
with ``c`` chunks and a ratio ≤ 1 the ideal is ``(c − 1) / c`` (the last chunk's scoring has
nothing left to hide behind). Prints one JSON object; no timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchlib import environment, write_json

from cosmos_sana.hookspecs import hookimpl

PROMPTS = ["a red cube on a table", "a blue ball in the grass", "a green tree at dusk", "a yellow car"]


class SlowScorer:
    """A plugin with one reward, ``slow``: sleeps per sample (GIL released, like GPU work), logs when it ran."""

    def __init__(self) -> None:
        self.seconds_per_sample = 0.0
        self.intervals: list[tuple[float, float]] = []

    def score(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        start = time.perf_counter()
        time.sleep(self.seconds_per_sample * media.shape[0])
        self.intervals.append((start, time.perf_counter()))
        return media.flatten(1).mean(dim=1).tolist()

    @hookimpl
    def cosmos_sana_rewards(self) -> list[Any]:
        from cosmos_sana.specs import RewardSpec

        return [RewardSpec(name="slow", target=self.score, modality="image")]


def payloads(count: int) -> list[Any]:
    from cosmos_rl.dispatcher.data.schema import RLPayload

    return [RLPayload(prompt={"prompt": PROMPTS[i % len(PROMPTS)], "metadata": {}}, prompt_idx=i) for i in range(count)]


def run_mode(data: dict, mode: str, scorer: SlowScorer, registry: Any, steps: int) -> list[dict[str, float]]:
    """``steps`` timed steps (after one warm-up) of rollout + reward calls in ``mode``."""
    from cosmos_sana.compat.cosmos_rl import cosmos_config_class
    from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn
    from cosmos_sana_plugins.trainers.local_loop import build_components, score_payload

    data = copy.deepcopy(data)
    data["custom"]["reward_runtime"] = {"mode": mode}
    config = cosmos_config_class().from_dict(data)
    _, rollout = build_components(config)
    rollout.registry = registry
    reward_fn = CosmosRewardFn(registry)
    rows = []
    for step in range(steps + 1):
        batch = payloads(config.rollout.batch_size)
        scorer.intervals.clear()
        began = time.perf_counter()
        results = rollout.rollout_generation(batch, None, None, None)
        generated = time.perf_counter()
        for payload, result in zip(batch, results):
            payload.completions = result.completions
            score_payload(reward_fn, payload, config)
        done = time.perf_counter()
        scoring = sum(b - a for a, b in scorer.intervals)
        hidden = sum(max(0.0, min(b, generated) - max(a, began)) for a, b in scorer.intervals)
        if step:  # step 0 warms up
            rows.append({
                "generation_s": generated - began, "scoring_s": scoring, "wall_s": done - began,
                "exposed_scoring_s": done - generated, "hidden_fraction": hidden / scoring if scoring else 0.0,
            })
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="toml/tiny/sana-image-grpo.toml")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode (after one warm-up)")
    parser.add_argument("--mini-batch", type=int, default=2, help="[rollout] n_generation_mini_batch")
    parser.add_argument("--score-ratio", type=float, default=1.0, help="scoring time / generation time")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 keeps a shared CPU box steady)")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from cosmos_sana.plugin_manager import load_plugins
    from cosmos_sana.tools.tiny import build_pipeline
    from cosmos_sana.validation import load_toml

    scorer = SlowScorer()
    registry = load_plugins(extra=[scorer])
    with tempfile.TemporaryDirectory() as scratch:
        data = load_toml(args.recipe)
        data["policy"]["model_name_or_path"] = str(build_pipeline(Path(scratch) / "pipeline"))
        data["train"]["output_dir"] = str(Path(scratch) / "run")
        data["rollout"]["n_generation_mini_batch"] = args.mini_batch
        data["custom"]["rewards"] = [{"name": "slow"}]
        data["custom"]["logging"] = {"progress_bar": False}
        calibration = summary(run_mode(data, "sync", scorer, registry, 1))
        samples = data["rollout"]["batch_size"] * data["rollout"]["n_generation"]
        scorer.seconds_per_sample = args.score_ratio * calibration["generation_s"] / samples
        sync = summary(run_mode(data, "sync", scorer, registry, args.steps))
        asynchronous = summary(run_mode(data, "async", scorer, registry, args.steps))
    chunks = -(-samples // args.mini_batch)
    write_json({
        "bench": "reward_overlap",
        "env": environment(torch.device("cpu")),
        "config": {"recipe": args.recipe, "samples_per_step": samples, "mini_batch": args.mini_batch,
                   "chunks": chunks, "score_ratio": args.score_ratio, "steps": args.steps,
                   "scorer_s_per_sample": scorer.seconds_per_sample},
        "sync": sync,
        "async": asynchronous,
        "hidden_fraction": asynchronous["hidden_fraction"],
        "ideal_hidden_fraction": min(1.0, 1.0 / args.score_ratio) * (chunks - 1) / chunks if args.score_ratio else 1.0,
        "speedup_vs_sync": sync["wall_s"] / asynchronous["wall_s"],
    }, args.json)


if __name__ == "__main__":
    main()
