"""Sample order: a function of (seed, epoch), sharded by rank, resumable mid-epoch."""

from __future__ import annotations

import itertools

import pytest
import torch

from cosmos_sana.sample_order import BucketBatchSampler, EpochSampler, epoch_permutation


def test_epoch_permutation_is_torch_randperm_of_seed_plus_epoch():
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(7 + 3)).tolist()
    assert epoch_permutation(10, seed=7, epoch=3) == expected
    assert sorted(expected) == list(range(10))
    assert epoch_permutation(10, 7, 3) != epoch_permutation(10, 7, 4)


def test_resume_mid_epoch_continues_the_same_order():
    reference = EpochSampler(10, seed=5)
    reference.set_epoch(2)
    full = list(reference)

    interrupted = EpochSampler(10, seed=5)
    interrupted.set_epoch(2)
    seen = list(itertools.islice(iter(interrupted), 4))
    state = interrupted.state_dict()
    assert state == {"seed": 5, "epoch": 2, "position": 4}

    resumed = EpochSampler(10, seed=5)
    resumed.set_epoch(2)  # cosmos-rl sets the epoch, then restores the state
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # setting the same epoch again keeps the position
    assert seen + list(resumed) == full


def test_seed_mismatch_is_refused():
    with pytest.raises(ValueError, match="seed 1, this run uses 2"):
        EpochSampler(4, seed=2).load_state_dict({"seed": 1, "epoch": 0, "position": 0})


def test_ranks_partition_the_epoch():
    shards = [list(EpochSampler(7, num_replicas=2, rank=r, seed=3)) for r in range(2)]
    order = epoch_permutation(7, 3, 0)
    padded = order + order[:1]  # 7 → 8 by wrapping, like DistributedSampler
    assert shards == [padded[0::2], padded[1::2]]
    assert list(EpochSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]
    assert len(EpochSampler(7, num_replicas=2, rank=0, drop_last=True)) == 3


def test_bucket_batches_share_a_bucket_and_resume():
    buckets = ["wide", "tall", "wide", "wide", "tall", "wide", "square"]
    sampler = BucketBatchSampler(buckets, batch_size=2, seed=11)
    batches = list(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(7))
    assert all(len({buckets[i] for i in batch}) == 1 for batch in batches)
    assert sorted(len(b) for b in batches) == [1, 2, 2, 2]  # wide 4 → 2+2, tall 2, square 1
    assert len(BucketBatchSampler(buckets, 2, drop_last=True)) == 3

    partial = BucketBatchSampler(buckets, batch_size=2, seed=11)
    head = list(itertools.islice(iter(partial), 2))
    resumed = BucketBatchSampler(buckets, batch_size=2, seed=11)
    resumed.load_state_dict(partial.state_dict())
    assert head + list(resumed) == batches
