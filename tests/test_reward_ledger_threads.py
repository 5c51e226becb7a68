"""The reward ledger under cosmos-rl's reward threads: concurrent reward calls each take their own ids,
and a scheduler batch shared by two prompts (one rollout chunk spanning both) is collected once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from cosmos_sana.config import RewardRef
from cosmos_sana.rewards import ledger
from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn
from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet

CONFIG = {"custom": {"package": "cosmos-sana", "rewards": [{"name": "mean"}], "reward_runtime": {"mode": "async"}}}


def submit_one_batch(registry: Any, sample_ids: list[str], delay: float) -> tuple[torch.Tensor, RewardScheduler]:
    """One scheduler batch holding ``sample_ids`` (values 0.1, 0.2, …), scored after ``delay`` seconds."""
    scheduler = RewardScheduler(ScorerSet.build([RewardRef(name="mean")], registry), retries=0)
    media = torch.stack([torch.full((3, 4, 4), (i + 1) / 10) for i in range(len(sample_ids))])
    metadata = [{"sid": s, "delay": delay} for s in sample_ids]
    ledger.LEDGER.submit(scheduler, "shared-chunk", sample_ids, media, ["p"] * len(sample_ids), metadata)
    return media, scheduler


def test_two_prompts_of_one_batch_scored_in_two_threads_get_their_own_rewards(recording_scorers):
    """cosmos-rl's reward threads each score whole payloads, one completion per call, in order."""
    scorers, registry = recording_scorers
    prompts = {"p0": ["threads/0/0", "threads/0/1"], "p1": ["threads/1/0", "threads/1/1"]}
    media, scheduler = submit_one_batch(registry, [s for ids in prompts.values() for s in ids], delay=0.2)
    rows = {"p0": media[:2], "p1": media[2:]}
    fn, start = CosmosRewardFn(registry), threading.Barrier(2)

    def score(prompt: str) -> list[float]:
        start.wait()  # both wait on the same unscored batch, then both finish it
        tagged = ledger.tagged(prompt, prompts[prompt])
        return [fn(row, None, config=CONFIG, prompt=tagged)[0] for row in rows[prompt]]

    with scheduler, ThreadPoolExecutor(2) as pool:
        totals = dict(zip(prompts, pool.map(score, prompts)))
    assert totals == {"p0": pytest.approx([0.1, 0.2]), "p1": pytest.approx([0.3, 0.4])}
    assert scheduler.pending() == []  # the shared batch was collected, once
    assert not ledger.LEDGER.known([s for ids in prompts.values() for s in ids])
    assert set(scorers.calls.values()) == {1}


def test_concurrent_calls_for_one_prompt_never_share_an_id(recording_scorers):
    _, registry = recording_scorers
    ids = [f"race/{i}" for i in range(8)]
    media, scheduler = submit_one_batch(registry, ids, delay=0.05)
    fn, prompt, start = CosmosRewardFn(registry), ledger.tagged("p", ids), threading.Barrier(len(ids))

    def score(row: torch.Tensor) -> float:
        start.wait()
        return fn(row, None, config=CONFIG, prompt=prompt)[0]

    with scheduler, ThreadPoolExecutor(len(ids)) as pool:
        totals = list(pool.map(score, media))
    assert sorted(totals) == pytest.approx([(i + 1) / 10 for i in range(len(ids))])  # each id exactly once
    with pytest.raises(ledger.UnknownSampleError, match=r"race/0.*taken already"):
        fn(media[0], None, config=CONFIG, prompt=prompt)
