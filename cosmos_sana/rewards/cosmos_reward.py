"""The reward function handed to cosmos-rl: scores ``[[custom.rewards]]`` on completions.

cosmos-rl calls ``fn(completion, reference, prompt=..., config=..., **kw)`` per
completion (``CHW`` image / ``TCHW`` video in [0, 1]) and expects ``(total, {component:
score})``; with ``train_policy.group_reward_calculation = true`` it passes the group's
list of completions and expects ``([totals], [{component: score}, ...])``. The
components land in cosmos-rl's per-rollout report metrics beside the total.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from cosmos_sana.plugin_manager import PluginRegistry
from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.settings import settings_of


def prompt_text(prompt: Any) -> tuple[str, dict]:
    """cosmos-rl's payload prompt (a string, or a dict with ``"prompt"``) → (text, metadata)."""
    if isinstance(prompt, str):
        return prompt, {}
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        return prompt["prompt"], {k: v for k, v in prompt.items() if k != "prompt"}
    if prompt is None:
        return "", {}
    raise TypeError(f"cannot read a prompt text out of {type(prompt).__name__}: {prompt!r:.200}")


class CosmosRewardFn:
    """One cosmos-rl reward function for all ``[[custom.rewards]]`` terms (scored inline, with retries)."""

    __name__ = "cosmos_sana_reward"

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry
        self._scheduler: RewardScheduler | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def scheduler(self, cosmos_config: Any, device: Any) -> RewardScheduler:
        with self._lock:
            if self._scheduler is None:
                settings = settings_of(cosmos_config)
                runtime = settings.reward_runtime
                scorers = ScorerSet.from_settings(settings, self.registry, runtime.device or device)
                self._scheduler = RewardScheduler(
                    scorers, mode="sync", retries=runtime.retries, timeout_s=runtime.timeout_s
                )
            return self._scheduler

    def __call__(self, completion: Any, reference: Any = None, *, config: Any = None, prompt: Any = None, **kw: Any):
        import torch

        batched = isinstance(completion, (list, tuple))
        samples = [torch.as_tensor(c) for c in (completion if batched else [completion])]
        text, metadata = prompt_text(prompt)
        metadata = {**metadata, "reference": reference}
        scheduler = self.scheduler(config, samples[0].device)
        batch_id = next(self._ids)
        ids = [(batch_id, i) for i in range(len(samples))]
        scheduler.submit(batch_id, ids, torch.stack(samples), [text] * len(samples), [metadata] * len(samples))
        scores = scheduler.collect(batch_id)
        components = [{name: values[i] for name, values in scores.components.items()} for i in range(len(samples))]
        if batched:
            return scores.total, components
        return scores.total[0], components[0]
