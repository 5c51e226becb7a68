"""Multi-reward combination and the asynchronous scheduler: matching, retries, failures."""

from __future__ import annotations

import pytest
import torch

from cosmos_sana.config import RewardRef
from cosmos_sana.rewards.combine import combine
from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn
from cosmos_sana.rewards.scheduler import RewardScheduler, RewardScoringError
from cosmos_sana.rewards.scorers import ScorerSet


def batch(sids: list[int], delay: float = 0.0) -> dict:
    """Sample ``sid`` is a constant image of value sid/100, so its 'mean' score is sid/100."""
    return dict(
        sample_ids=sids,
        media=torch.stack([torch.full((3, 4, 4), sid / 100) for sid in sids]),
        prompts=[f"p{sid}" for sid in sids],
        metadata=[{"sid": sid, "delay": delay} for sid in sids],
    )


def scheduler(registry, names: list[str], **options) -> RewardScheduler:
    return RewardScheduler(ScorerSet.build([RewardRef(name=n) for n in names], registry), **options)


def test_combine_clamps_scales_and_weights():
    refs = [RewardRef(name="a", weight=2.0, clip_max=1.0, scale=0.5), RewardRef(name="b", clip_min=-1.0, scale=3.0)]
    # a: 2·0.5·[0.5, min(3,1)] = [0.5, 1.0];  b: 3·[max(−2,−1), 1] = [−3, 3]
    assert combine({"a": [0.5, 3.0], "b": [-2.0, 1.0]}, refs) == pytest.approx([-2.5, 4.0])


def test_async_batches_are_matched_by_sample_id_and_scored_once(recording_scorers):
    scorers, registry = recording_scorers
    with scheduler(registry, ["mean", "flaky"], workers=2, retries=2) as sched:
        scorers.flaky_failures = 0
        futures = {
            "slow": sched.submit("slow", **batch([1, 2, 3], delay=0.3)),
            "fast": sched.submit("fast", **batch([10, 11])),
            "mid": sched.submit("mid", **batch([20, 21, 22, 23], delay=0.1)),
        }
        assert sorted(sched.pending()) == ["fast", "mid", "slow"]
        results = {b: sched.collect(b) for b in ("mid", "slow", "fast")}
        assert sched.pending() == []
    for name, sids in (("slow", [1, 2, 3]), ("fast", [10, 11]), ("mid", [20, 21, 22, 23])):
        result = results[name]
        assert futures[name].result() is result
        assert result.sample_ids == tuple(sids)
        assert result.components["mean"] == pytest.approx([s / 100 for s in sids])
        assert result.total == pytest.approx([2 * s / 100 for s in sids])
        assert result.by_sample()[sids[-1]] == pytest.approx({"total": 2 * sids[-1] / 100, "mean": sids[-1] / 100,
                                                               "flaky": sids[-1] / 100})
    all_sids = [1, 2, 3, 10, 11, 20, 21, 22, 23]
    assert {key: count for key, count in scorers.calls.items()} == {
        (name, sid): 1 for name in ("mean", "flaky") for sid in all_sids
    }


def test_submit_returns_before_scoring_ends(recording_scorers):
    scorers, registry = recording_scorers
    with scheduler(registry, ["gated"]) as sched:
        future = sched.submit(0, **batch([1, 2]))
        assert not future.done()  # the loop goes on while the scorer works
        with pytest.raises(ValueError, match=r"sample ids \[2\] are already being scored"):
            sched.submit(1, **batch([2, 3]))
        with pytest.raises(ValueError, match="was submitted already"):
            sched.submit(0, **batch([4]))
        scorers.gate.set()
        assert sched.collect(0).total == [2.0, 2.0]
    with pytest.raises(KeyError, match="never submitted or is collected already"):
        sched.collect(0)


def test_a_failing_scorer_is_retried_alone(recording_scorers):
    scorers, registry = recording_scorers
    scorers.flaky_failures = 2
    with scheduler(registry, ["mean", "flaky"], retries=2) as sched:
        sched.submit(7, **batch([5, 6]))
        result = sched.collect(7)
    assert result.components["flaky"] == pytest.approx([0.05, 0.06])
    assert scorers.calls[("flaky", 5)] == 3 and scorers.calls[("mean", 5)] == 1


def test_persistent_failure_names_scorer_and_samples_and_fails_the_run(recording_scorers):
    scorers, registry = recording_scorers
    with scheduler(registry, ["mean", "broken"], retries=1) as sched:
        sched.submit("b0", **batch([1, 2]))
        with pytest.raises(RewardScoringError, match=r"reward 'broken' failed on batch 'b0' \(samples \[1, 2\]\) "
                                                     r"after 2 attempt\(s\): RuntimeError: model exploded") as info:
            sched.collect("b0")
        assert info.value.sample_ids == [1, 2]
        with pytest.raises(RuntimeError, match="reward scoring already failed"):
            sched.submit("b1", **batch([3]))
    assert scorers.calls[("broken", 1)] == 2


def test_timeout_counts_as_a_failure(recording_scorers):
    scorers, registry = recording_scorers
    with pytest.raises(RewardScoringError, match="'gated'.*TimeoutError: no result within 0.2 s"):
        with scheduler(registry, ["gated"], retries=0, timeout_s=0.2) as sched:
            sched.submit(0, **batch([1]))
            sched.collect(0)


def test_non_finite_score_is_an_error_not_a_zero(recording_scorers):
    _, registry = recording_scorers
    with scheduler(registry, ["nan"], mode="sync", retries=0) as sched:
        sched.submit(0, **batch([4]))
        with pytest.raises(RewardScoringError, match=r"samples \[4\].*reward 'nan' returned nan at batch index 0"):
            sched.collect(0)


def test_cosmos_reward_fn_per_sample_and_grouped(recording_scorers):
    _, registry = recording_scorers
    config = {"custom": {"package": "cosmos-sana", "rewards": [
        {"name": "mean", "weight": 0.5}, {"name": "flaky", "clip_max": 0.2}]}}
    fn = CosmosRewardFn(registry)
    recording_scorers[0].flaky_failures = 0
    image = torch.full((3, 4, 4), 0.3)
    total, parts = fn(image, "ref", config=config, prompt={"prompt": "a cat", "tag": "x"})
    assert total == pytest.approx(0.5 * 0.3 + 0.2) and parts == pytest.approx({"mean": 0.3, "flaky": 0.3})
    totals, parts = fn([image, torch.full((3, 4, 4), 0.1)], "ref", config=config, prompt="a cat")
    assert totals == pytest.approx([0.35, 0.15])
    assert parts[1] == pytest.approx({"mean": 0.1, "flaky": 0.1})


def test_one_reward_twice_needs_labels(recording_scorers):
    _, registry = recording_scorers
    with pytest.raises(ValueError, match=r"custom.rewards\[1\]: reward 'mean' is configured twice; give one a `label`"):
        ScorerSet.build([RewardRef(name="mean"), RewardRef(name="mean")], registry)
    both = ScorerSet.build([RewardRef(name="mean"), RewardRef(name="mean", label="mean_capped", clip_max=0.1)], registry)
    scores = both.score(batch([30])["media"], ["p"], [{"sid": 30}])
    assert scores.components == {"mean": pytest.approx([0.3]), "mean_capped": pytest.approx([0.3])}
    assert scores.total == pytest.approx([0.4])
