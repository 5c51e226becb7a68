"""The reward function handed to cosmos-rl: scores ``[[custom.rewards]]`` on completions.

cosmos-rl calls ``fn(completion, reference, prompt=..., config=..., **kw)`` per
completion (``CHW`` image / ``TCHW`` video in [0, 1]) and expects ``(total, {component:
score})``; with ``train_policy.group_reward_calculation = true`` it passes the group's
completions and expects ``([totals], [{component: score}, ...])``. The components land in
cosmos-rl's per-rollout report metrics beside the total.

With ``[custom.reward_runtime] mode = "async"`` the ``sana`` rollout has already submitted
the samples and tagged the prompt with their ids (:mod:`cosmos_sana.rewards.ledger`): the
function takes those scores by position, waiting if needed (a group's ``k``-th completion is
the ``k``-th id; a single completion is the prompt's first id not taken yet, as cosmos-rl scores
a group's completions one call at a time in order); an id never submitted is an error.
Untagged prompts, and in ``mode = "sync"`` ids never submitted, are scored inline (with retries).

The validation reward function (``validation=True``) scores with ``[custom.guards]
holdout_rewards`` when that list is set: a second scorer the policy is not trained on, so a
reward hack shows as training reward rising while the held-out score does not. It then always
scores inline (the rollout submits no validation samples in that case).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from cosmos_sana.payload_prompt import parse_prompt
from cosmos_sana.plugin_manager import PluginRegistry
from cosmos_sana.rewards import ledger
from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.settings import settings_of


def split_completions(completion: Any, config: Any) -> tuple[list[Any], bool]:
    """cosmos-rl's ``completion`` argument → (per-sample tensors, whether it was a group).

    A group is a list, or a tensor with one more dim than a sample of the run's modality.
    """
    import torch

    if isinstance(completion, (list, tuple)):
        return [torch.as_tensor(c) for c in completion], True
    completion = torch.as_tensor(completion)
    is_video = getattr(getattr(getattr(config, "policy", None), "diffusers", None), "is_video", None)
    if is_video is not None and completion.ndim == (5 if is_video else 4):
        return list(completion.unbind(0)), True
    return [completion], False


class CosmosRewardFn:
    """One cosmos-rl reward function for all ``[[custom.rewards]]`` terms (or, for validation,
    the ``[custom.guards] holdout_rewards`` terms when set)."""

    __name__ = "cosmos_sana_reward"

    def __init__(self, registry: PluginRegistry, *, validation: bool = False) -> None:
        self.registry = registry
        self.validation = validation
        self._scheduler: RewardScheduler | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def holdout(self, cosmos_config: Any) -> bool:
        """Whether this function scores with ``[custom.guards] holdout_rewards``."""
        return self.validation and bool(settings_of(cosmos_config).guards.holdout_rewards)

    def scheduler(self, cosmos_config: Any, device: Any) -> RewardScheduler:
        """The inline scheduler (built on first use)."""
        with self._lock:
            if self._scheduler is None:
                settings = settings_of(cosmos_config)
                runtime = settings.reward_runtime
                if self.holdout(cosmos_config):
                    refs, where = settings.guards.holdout_rewards, "custom.guards.holdout_rewards"
                    scorers = ScorerSet.build(refs, self.registry, runtime.device or device, where=where)
                else:
                    scorers = ledger.shared_scorers(settings, self.registry, device)
                self._scheduler = RewardScheduler(
                    scorers, mode="sync", retries=runtime.retries, timeout_s=runtime.timeout_s
                )
            return self._scheduler

    def __call__(self, completion: Any, reference: Any = None, *, config: Any = None, prompt: Any = None, **kw: Any):
        samples, batched = split_completions(completion, config)
        ids = None if self.holdout(config) else ledger.sample_ids_of(prompt)
        if ids is not None and (ledger.LEDGER.known(ids) or settings_of(config).reward_runtime.mode == "async"):
            rows = ledger.LEDGER.take_group(ids, len(samples)) if batched else [ledger.LEDGER.take_next(ids)]
        else:
            rows = self._score_inline(samples, prompt, config)
        totals = [row.pop("total") for row in rows]
        return (totals, rows) if batched else (totals[0], rows[0])

    def _score_inline(self, samples: list[Any], prompt: Any, config: Any) -> list[dict[str, float]]:
        import torch

        text, metadata = parse_prompt(prompt, "the reward function's prompt")
        scheduler = self.scheduler(config, samples[0].device)
        batch_id = next(self._ids)
        ids = [(batch_id, i) for i in range(len(samples))]
        scheduler.submit(batch_id, ids, torch.stack(samples), [text] * len(samples), [metadata] * len(samples))
        return list(scheduler.collect(batch_id).by_sample().values())
