"""Asynchronous scoring inside the training loop: samples submitted by id, each score taken once.

With ``[custom.reward_runtime] mode = "async"`` the ``sana`` rollout submits every generated
chunk to this process's shared :class:`RewardScheduler` under stable sample ids and writes the
ids of each prompt's samples, in generation order, into the payload's prompt
(:data:`SAMPLE_IDS_KEY`). ``CosmosRewardFn`` then takes the scores from :data:`LEDGER`,
waiting if they are not ready, by position in that list:

* a whole group (``train_policy.group_reward_calculation = true``): cosmos-rl passes every
  completion of the prompt in generation order, so the ``k``-th completion is the ``k``-th id
  (:meth:`RewardLedger.take_group`; a different count is an error naming the ids);
* one completion per call: cosmos-rl calls once per completion, in generation order, so each
  call gets the prompt's first id not taken yet (:meth:`RewardLedger.take_next`).

Nothing depends on where a completion's data lives: a copy of a completion gets the reward of
its position. A taken id is forgotten: a second request for it, or one for an id never
submitted, is an error naming the id. A scoring failure re-raises the scheduler's error
(scorer and samples).

:data:`LEDGER` and the caches behind :func:`shared_scorers` and :func:`shared_scheduler` are
process-wide: docs/architecture.md, "Trainer–rollout link and process-wide state", says who
writes and reads each, how long it lives and why it cannot belong to one component.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.step_clock import STEP_CLOCK

#: key of the prompt dict that lists the sample ids of the prompt's completions, in order
SAMPLE_IDS_KEY = "cosmos_sana_sample_ids"


class UnknownSampleError(KeyError):
    """A reward was requested for a sample id that was never submitted or was taken already."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def tagged(prompt: Any, sample_ids: Sequence[str]) -> dict[str, Any]:
    """A copy of a payload prompt (string or dict) that lists its samples' ids."""
    base = {"prompt": prompt, "metadata": {}} if isinstance(prompt, str) else dict(prompt)
    return {**base, SAMPLE_IDS_KEY: list(sample_ids)}


def sample_ids_of(prompt: Any) -> list[str] | None:
    """The sample ids a prompt was tagged with, or None."""
    if isinstance(prompt, dict) and SAMPLE_IDS_KEY in prompt:
        return list(prompt[SAMPLE_IDS_KEY])
    return None


@dataclass
class _Entry:
    scheduler: RewardScheduler
    batch_id: Hashable
    future: Future
    timed: bool = True


class RewardLedger:
    """Which scheduler batch holds each submitted sample id; hands each id's scores out once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._calls = 0

    def next_call(self) -> int:
        """A process-unique number for one rollout call (its sample ids' prefix)."""
        with self._lock:
            self._calls += 1
            return self._calls

    def submit(
        self,
        scheduler: RewardScheduler,
        batch_id: Hashable,
        sample_ids: Sequence[str],
        media: Any,
        prompts: Sequence[str],
        metadata: Sequence[dict],
        *,
        timed: bool = True,
    ) -> None:
        """Score ``sample_ids`` on ``scheduler``; ``timed``: waiting for them counts in the step clock."""
        with self._lock:
            again = [s for s in sample_ids if s in self._entries]
        if again:
            raise ValueError(f"batch {batch_id!r}: sample ids {again} were submitted already")
        future = scheduler.submit(batch_id, sample_ids, media, prompts, metadata)
        with self._lock:
            self._entries.update({s: _Entry(scheduler, batch_id, future, timed=timed) for s in sample_ids})

    def known(self, sample_ids: Sequence[str]) -> bool:
        """Whether any of ``sample_ids`` is waiting to be taken."""
        with self._lock:
            return any(s in self._entries for s in sample_ids)

    def take_group(self, sample_ids: Sequence[str], count: int) -> list[dict[str, float]]:
        """The scores of a prompt's ``count`` completions, which must be all of its samples
        (``sample_ids``, in generation order): the ``k``-th completion is ``sample_ids[k]``."""
        if count != len(sample_ids):
            raise ValueError(
                f"the reward function got {count} completions for a prompt whose {len(sample_ids)} samples are "
                f"{list(sample_ids)}: asynchronous rewards match a group by position, so cosmos-rl must pass the "
                "whole group in generation order"
            )
        with self._lock:
            gone = [s for s in sample_ids if s not in self._entries]
            if gone:
                raise UnknownSampleError(
                    f"a reward was requested for samples {gone} (of {list(sample_ids)}), which were never "
                    "submitted for scoring or whose rewards were taken already"
                )
            entries = [self._entries.pop(s) for s in sample_ids]
        return [self._scores(s, entry) for s, entry in zip(sample_ids, entries)]

    def take_next(self, sample_ids: Sequence[str]) -> dict[str, float]:
        """The scores of the first of a prompt's samples (``sample_ids``, in generation order) not
        taken yet: cosmos-rl scores one completion per call in that order. The id is chosen and
        removed under one lock, so concurrent callers never share one; position matching still needs
        each prompt's calls in order, which holds as cosmos-rl's reward threads each score whole payloads."""
        with self._lock:
            sample_id = next((s for s in sample_ids if s in self._entries), None)
            if sample_id is None:
                raise UnknownSampleError(
                    f"a reward was requested for samples {list(sample_ids)}, which were never submitted for "
                    "scoring or whose rewards were taken already"
                )
            entry = self._entries.pop(sample_id)
        return self._scores(sample_id, entry)

    def _scores(self, sample_id: str, entry: _Entry) -> dict[str, float]:
        """``{"total": …, component: …}`` of a sample taken out of the ledger (waits for its batch)."""
        waiting = STEP_CLOCK.now()
        scores = entry.future.result()  # a RewardScoringError names the scorer and the samples
        if entry.timed:
            STEP_CLOCK.add("reward_wait", waiting)
        with self._lock:
            if entry.batch_id in entry.scheduler.pending():
                entry.scheduler.collect(entry.batch_id)
        index = scores.sample_ids.index(sample_id)
        return {"total": scores.total[index], **{name: v[index] for name, v in scores.components.items()}}


#: this process's ledger (the rollout and the reward function share it)
LEDGER = RewardLedger()

_scorer_sets: dict[str, ScorerSet] = {}
_schedulers: dict[str, RewardScheduler] = {}
_shared_lock = threading.Lock()


def _key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def shared_scorers(settings: Any, registry: Any, device: Any) -> ScorerSet:
    """This process's scorers for ``settings``' rewards (reward models load once per process:
    the async scheduler, the inline reward function and best-of-n previews all use them)."""
    device = settings.reward_runtime.device or device
    key = _key([r.model_dump(mode="json") for r in settings.rewards], device, id(registry))
    with _shared_lock:
        if key not in _scorer_sets:
            _scorer_sets[key] = ScorerSet.from_settings(settings, registry, device)
        return _scorer_sets[key]


def shared_scheduler(settings: Any, registry: Any, device: Any) -> RewardScheduler:
    """This process's scheduler for ``settings``' rewards and runtime (built on first use)."""
    scorers = shared_scorers(settings, registry, device)
    runtime = settings.reward_runtime
    key = _key(runtime.model_dump(mode="json"), id(scorers))
    with _shared_lock:
        if key not in _schedulers:
            _schedulers[key] = RewardScheduler(
                scorers, mode=runtime.mode, workers=runtime.workers, retries=runtime.retries, timeout_s=runtime.timeout_s
            )
        return _schedulers[key]
