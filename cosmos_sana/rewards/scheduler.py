"""Score beside the training loop: ``submit`` a batch now, ``collect`` its scores later.

Worker threads run the scorers (on their own accelerator stream when the media
lives on one), so the next rollout overlaps the scoring of this one. Results are
matched by sample id. A scorer that raises or exceeds ``timeout_s`` is retried
``retries`` times (only that scorer: finished components are kept), then the
batch fails with a :class:`RewardScoringError` naming the scorer and the sample
ids, and with ``fail_fast`` every later ``submit`` fails too. A score is never
silently replaced by 0.

A timed-out scorer call cannot be interrupted: its thread (a daemon) is left to
finish on its own and its result is discarded.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from cosmos_sana.log import get_logger
from cosmos_sana.rewards.combine import combine
from cosmos_sana.rewards.scorers import Scorer, ScorerSet, as_media_batch, check_batch

logger = get_logger(__name__)


class RewardScoringError(RuntimeError):
    """A scorer kept failing on a batch; names the scorer, the batch and the samples."""

    def __init__(self, scorer: str, batch_id: Hashable, sample_ids: Sequence[Hashable], attempts: int, cause: BaseException):
        super().__init__(
            f"reward {scorer!r} failed on batch {batch_id!r} (samples {list(sample_ids)}) "
            f"after {attempts} attempt(s): {type(cause).__name__}: {cause}"
        )
        self.scorer, self.batch_id, self.sample_ids, self.attempts = scorer, batch_id, list(sample_ids), attempts


@dataclass(frozen=True)
class BatchScores:
    """Scores of one submitted batch, in the order its sample ids were submitted."""

    batch_id: Hashable
    sample_ids: tuple[Hashable, ...]
    total: list[float]
    components: dict[str, list[float]]

    def by_sample(self) -> dict[Hashable, dict[str, float]]:
        """sample id → ``{"total": …, reward name: …}``."""
        return {
            sid: {"total": self.total[i], **{name: v[i] for name, v in self.components.items()}}
            for i, sid in enumerate(self.sample_ids)
        }


@dataclass
class _Job:
    batch_id: Hashable
    sample_ids: tuple[Hashable, ...]
    media: Any
    prompts: list[str]
    metadata: list[dict]
    scorers: list[Scorer]
    ready: Any  # accelerator event recorded on the submitting stream, or None
    future: Future


_STOP = object()


class RewardScheduler:
    """Asynchronous (``workers`` threads) or inline (``mode="sync"``) batch scoring."""

    def __init__(
        self,
        scorers: ScorerSet,
        *,
        mode: str = "async",
        workers: int = 1,
        retries: int = 2,
        timeout_s: float = 600.0,
        fail_fast: bool = True,
    ) -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"reward_runtime.mode must be 'async' or 'sync', got {mode!r}")
        self.scorers = scorers
        self.mode, self.retries, self.timeout_s, self.fail_fast = mode, retries, timeout_s, fail_fast
        self._lock = threading.Lock()
        self._batches: dict[Hashable, _Job] = {}
        self._in_flight: set[Hashable] = set()
        self._failure: RewardScoringError | None = None
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"cosmos-sana-reward-{i}", daemon=True)
            for i in range(workers if mode == "async" else 0)
        ]
        for thread in self._threads:
            thread.start()

    # -- public API -----------------------------------------------------------------

    def submit(
        self,
        batch_id: Hashable,
        sample_ids: Sequence[Hashable],
        media: Any,
        prompts: Sequence[str],
        metadata: Sequence[dict] | None = None,
        rewards: Iterable[str] | None = None,
    ) -> Future:
        """Queue a batch; the future resolves to its :class:`BatchScores`.

        ``rewards`` picks a subset of the configured rewards (default: all).
        """
        media = as_media_batch(media)
        prompts, metadata = check_batch(media.shape[0], prompts, metadata)
        sample_ids = tuple(sample_ids)
        if len(sample_ids) != media.shape[0]:
            raise ValueError(f"batch {batch_id!r}: {len(sample_ids)} sample ids for {media.shape[0]} samples")
        scorers = self.scorers.scorers if rewards is None else self.scorers.subset(rewards).scorers
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("reward scheduler is closed")
            if self._failure is not None:
                raise RuntimeError(f"reward scoring already failed: {self._failure}") from self._failure
            if batch_id in self._batches:
                raise ValueError(f"batch {batch_id!r} was submitted already and is not collected yet")
            self._check_unique(batch_id, sample_ids)
            job = _Job(batch_id, sample_ids, media, prompts, metadata, scorers, _record_ready(media), future)
            self._batches[batch_id] = job
            self._in_flight.update(sample_ids)
        if self.mode == "sync":
            self._run(job)
        else:
            self._queue.put(job)
        return future

    def collect(self, batch_id: Hashable, timeout: float | None = None) -> BatchScores:
        """Wait for a batch's scores and forget the batch; raises its scoring error, if any."""
        with self._lock:
            if batch_id not in self._batches:
                raise KeyError(f"batch {batch_id!r} was never submitted or is collected already")
            job = self._batches[batch_id]
        if not wait([job.future], timeout=timeout).done:
            raise TimeoutError(f"batch {batch_id!r} is not scored after {timeout} s")
        with self._lock:
            self._batches.pop(batch_id, None)
        return job.future.result()

    def pending(self) -> list[Hashable]:
        """Batch ids submitted and not collected yet, oldest first."""
        with self._lock:
            return list(self._batches)

    def close(self) -> None:
        """Stop the workers once the queued batches are scored."""
        with self._lock:
            self._closed = True
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> "RewardScheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------

    def _check_unique(self, batch_id: Hashable, sample_ids: tuple[Hashable, ...]) -> None:
        if len(set(sample_ids)) != len(sample_ids):
            dupes = sorted({s for s in sample_ids if sample_ids.count(s) > 1}, key=repr)
            raise ValueError(f"batch {batch_id!r}: duplicate sample ids {dupes}")
        again = [s for s in sample_ids if s in self._in_flight]
        if again:
            raise ValueError(f"batch {batch_id!r}: sample ids {again} are already being scored")

    def _work(self) -> None:
        stream = None
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            if stream is None:
                stream = _new_stream(job.media.device)
            self._run(job, stream)

    def _run(self, job: _Job, stream: Any = None) -> None:
        try:
            components = {s.name: self._score_with_retries(s, job, stream) for s in job.scorers}
            total = combine(components, [s.ref for s in job.scorers])
            result = BatchScores(job.batch_id, job.sample_ids, total, components)
            logger.debug("scored batch %r: %s", job.batch_id, {k: _mean(v) for k, v in components.items()})
        except RewardScoringError as exc:
            with self._lock:
                if self.fail_fast and self._failure is None:
                    self._failure = exc
            logger.error("%s", exc)
            self._finish(job, error=exc)
        except BaseException as exc:  # a bug in combine or bookkeeping: never lose the batch silently
            self._finish(job, error=exc)
        else:
            self._finish(job, result=result)

    def _finish(self, job: _Job, result: BatchScores | None = None, error: BaseException | None = None) -> None:
        job.media = None  # free the batch as soon as it is scored
        with self._lock:
            self._in_flight.difference_update(job.sample_ids)
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    def _score_with_retries(self, scorer: Scorer, job: _Job, stream: Any) -> list[float]:
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return _call_with_timeout(scorer, job, stream, self.timeout_s)
            except Exception as exc:
                if attempt == attempts:
                    raise RewardScoringError(scorer.name, job.batch_id, job.sample_ids, attempts, exc) from exc
                logger.warning(
                    "reward %r failed on batch %r (attempt %d/%d): %s: %s; retrying",
                    scorer.name, job.batch_id, attempt, attempts, type(exc).__name__, exc,
                )
        raise AssertionError("unreachable")


def _call_with_timeout(scorer: Scorer, job: _Job, stream: Any, timeout_s: float) -> list[float]:
    """One scorer call in a fresh daemon thread (so a hung call can be abandoned)."""
    box: dict[str, Any] = {}
    done = threading.Event()
    media = job.media

    def run() -> None:
        try:
            with _on_stream(stream, job.ready):
                box["value"] = scorer(media, job.prompts, job.metadata)
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"cosmos-sana-reward-{scorer.name}", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"no result within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _device_module(device: Any) -> Any:
    import torch

    if device.type == "cpu":
        return None
    module = torch.get_device_module(device.type)
    return module if hasattr(module, "Stream") and hasattr(module, "Event") else None


def _record_ready(media: Any) -> Any:
    """An event on the submitting thread's stream: the media is written when it fires."""
    module = _device_module(media.device)
    if module is None:
        return None
    event = module.Event()
    event.record(module.current_stream(media.device))
    return event


def _new_stream(device: Any) -> Any:
    module = _device_module(device)
    return module.Stream(device=device) if module is not None else None


class _on_stream:
    """Run on ``stream`` (after ``ready`` fires); nothing to do on CPU."""

    def __init__(self, stream: Any, ready: Any) -> None:
        self.stream, self.ready, self._ctx = stream, ready, None

    def __enter__(self) -> None:
        if self.ready is not None and self.stream is None:
            self.ready.synchronize()
        if self.stream is not None:
            import torch

            if self.ready is not None:
                self.stream.wait_event(self.ready)
            self._ctx = torch.get_device_module(self.stream.device.type).stream(self.stream)
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
