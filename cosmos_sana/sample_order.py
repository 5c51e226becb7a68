"""Deterministic, resumable sample order.

Epoch ``e`` visits ``epoch_permutation(n, seed, e)``; ranks take every ``num_replicas``-th entry.
``state_dict()`` records (seed, epoch, position) and ``load_state_dict`` continues the same
order from there, so a resumed run sees exactly the samples the interrupted one had not.
Both samplers accept cosmos-rl's sampler factory keywords (``num_replicas``, ``rank``,
``shuffle``, ``drop_last``) and ``set_epoch``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler


def epoch_permutation(size: int, seed: int, epoch: int) -> list[int]:
    """A permutation of ``range(size)`` that depends only on (seed, epoch)."""
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


class _Resumable:
    seed: int
    epoch: int
    position: int

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` from its beginning; the current epoch keeps its position (resume)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def _start(self, length: int) -> None:
        if self.position >= length:  # a finished epoch iterated again repeats, like DistributedSampler
            self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.seed:
            raise ValueError(f"sampler state was saved with seed {state.get('seed')}, this run uses {self.seed}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class EpochSampler(_Resumable, Sampler[int]):
    """Indices of this rank, shuffled per epoch (or in order), resumable mid-epoch.

    ``position`` counts indices already yielded on this rank in the current epoch; a caller
    that prefetches can set it to the number actually consumed before saving.
    """

    def __init__(self, data_source: Sequence[Any] | int, *, num_replicas: int = 1, rank: int = 0,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0):
        self.size = data_source if isinstance(data_source, int) else len(data_source)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} out of range for {num_replicas} replicas")
        self.num_replicas, self.rank, self.shuffle, self.drop_last = num_replicas, rank, shuffle, drop_last
        self.seed, self.epoch, self.position = seed, 0, 0

    def _rank_indices(self) -> list[int]:
        order = epoch_permutation(self.size, self.seed, self.epoch) if self.shuffle else list(range(self.size))
        if self.drop_last:
            order = order[: len(order) - len(order) % self.num_replicas]
        elif order and len(order) % self.num_replicas:  # pad by wrapping, like DistributedSampler
            order += order[: self.num_replicas - len(order) % self.num_replicas]
        return order[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self._rank_indices()
        self._start(len(indices))
        while self.position < len(indices):
            index = indices[self.position]
            self.position += 1
            yield index

    def __len__(self) -> int:
        return len(self._rank_indices())


class BucketBatchSampler(_Resumable, Sampler[list[int]]):
    """Batches whose samples share a bucket (e.g. an aspect-ratio bin), resumable mid-epoch.

    Per epoch: each bucket's indices are permuted, cut into ``batch_size`` chunks, and the
    chunks of all buckets are permuted together; ranks take every ``num_replicas``-th batch.
    A bucket's last partial chunk is kept (smaller batch) unless ``drop_last``.
    """

    def __init__(self, buckets: Sequence[Hashable], batch_size: int, *, num_replicas: int = 1, rank: int = 0,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} out of range for {num_replicas} replicas")
        self.buckets, self.batch_size = list(buckets), batch_size
        self.num_replicas, self.rank, self.shuffle, self.drop_last = num_replicas, rank, shuffle, drop_last
        self.seed, self.epoch, self.position = seed, 0, 0

    def _rank_batches(self) -> list[list[int]]:
        members: dict[Hashable, list[int]] = defaultdict(list)
        size = len(self.buckets)
        order = epoch_permutation(size, self.seed, self.epoch) if self.shuffle else range(size)
        for index in order:
            members[self.buckets[index]].append(index)
        batches = [
            indices[start : start + self.batch_size]
            for indices in members.values()
            for start in range(0, len(indices), self.batch_size)
            if not (self.drop_last and start + self.batch_size > len(indices))
        ]
        if self.shuffle:
            batches = [batches[i] for i in epoch_permutation(len(batches), self.seed + 1, self.epoch)]
        return batches[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._rank_batches()
        self._start(len(batches))
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield batch

    def __len__(self) -> int:
        return len(self._rank_batches())
