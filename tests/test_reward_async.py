"""Asynchronous scoring in the loop: the ``sana`` rollout submits, cosmos-rl's reward calculator collects."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fixtures_trainers import build_rollout, build_trainer, recipe

from cosmos_sana.rewards import ledger
from cosmos_sana.rewards.cosmos_reward import CosmosRewardFn
from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet

PROMPTS = ["a red cube", "a blue ball", "a green tree"]
N = 4  # the tiny GRPO recipe's n_generation


@pytest.fixture
def fresh_schedulers(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Per-test shared schedulers (a failed one refuses later batches)."""
    monkeypatch.setattr(ledger, "_schedulers", {})
    yield
    for scheduler in ledger._schedulers.values():
        scheduler.close()


def config_for(pipeline: Any, tmp_path: Any, mode: str, rewards: list[str], **overrides: Any) -> Any:
    return recipe("sana-image-grpo", pipeline, tmp_path, {
        "custom.rewards": [{"name": name} for name in rewards],
        "custom.reward_runtime": {"mode": mode, "retries": 0},
        "rollout.n_generation_mini_batch": 2,  # 6 chunks: scoring overlaps generation
        **overrides,
    })


def payloads() -> list[Any]:
    from cosmos_rl.dispatcher.data.schema import RLPayload

    return [RLPayload(prompt={"prompt": p, "metadata": {"sid": i}}, prompt_idx=i) for i, p in enumerate(PROMPTS)]


def upstream_rewards(config: Any, reward_fn: Any, batch: list[Any], results: list[Any]) -> list[list[float]]:
    """cosmos-rl's own path from rollout results to rewards: payload update, then its local calculator."""
    from cosmos_rl.reward.admission import apply_rollout_result_to_payload
    from cosmos_rl.reward.local_calculator import LocalRewardCalculator

    for payload, result in zip(batch, results):
        apply_rollout_result_to_payload(payload, result, include_completed_conversations=False)
        payload.reference_answer = ""
    calculator = LocalRewardCalculator()
    calculator.setup(config, reward_fns=[reward_fn])
    scored, _, _ = calculator.compute_rewards(batch, False, 0)
    return [list(p.rewards) for p in scored]


def generate_and_score(pipeline, tmp_path, registry, mode, rewards, model=None, **overrides):
    config = config_for(pipeline, tmp_path / mode, mode, rewards, **overrides)
    model = model or build_trainer(config).model
    rollout = build_rollout(config, model)
    rollout.registry = registry
    batch = payloads()
    results = rollout.rollout_generation(batch, None, None, None)
    return batch, upstream_rewards(config, CosmosRewardFn(registry), batch, results), model


@pytest.mark.parametrize("grouped", [False, True], ids=["per-sample", "group"])
def test_async_rewards_equal_sync_and_each_sample_is_scored_once(
    grouped, tiny_image_pipeline_dir, tmp_path, cosmos_registries, recording_scorers, fresh_schedulers
):
    scorers, registry = recording_scorers
    rewards = ["mean", "jpeg_compressibility"]
    options = {"train.train_policy.group_reward_calculation": grouped}
    pipeline = tiny_image_pipeline_dir
    sync_batch, sync, model = generate_and_score(pipeline, tmp_path, registry, "sync", rewards, **options)
    assert all(ledger.SAMPLE_IDS_KEY not in p.prompt for p in sync_batch)
    scorers.calls.clear()

    batch, scored, _ = generate_and_score(pipeline, tmp_path, registry, "async", rewards, model, **options)
    assert scored == sync  # same seeds, same media: exactly the same rewards
    assert dict(scorers.calls) == {("mean", sid): N for sid in range(len(PROMPTS))}  # each sample once
    ids = [ledger.sample_ids_of(p.prompt) for p in batch]
    assert [len(i) for i in ids] == [N] * len(PROMPTS)
    assert not ledger.LEDGER.known([s for group in ids for s in group])  # every id collected
    assert all(s.pending() == [] for s in ledger._schedulers.values())


def test_a_failing_scorer_fails_the_run_naming_scorer_and_sample(
    tiny_image_pipeline_dir, tmp_path, cosmos_registries, recording_scorers, fresh_schedulers
):
    _, registry = recording_scorers
    # the failure surfaces in the reward call, or in the rollout's next submit if that comes first
    with pytest.raises(RuntimeError, match=r"reward 'broken' failed on batch .*rollout\d+/0/0@prompt0.*model exploded"):
        generate_and_score(tiny_image_pipeline_dir, tmp_path, registry, "async", ["broken"])


def submitted(registry: Any, sample_ids: list[str]) -> tuple[torch.Tensor, RewardScheduler]:
    """Samples of value 0.1, 0.2, … (reward ``mean`` = that value) submitted under ``sample_ids``."""
    from cosmos_sana.config import RewardRef

    scheduler = RewardScheduler(ScorerSet.build([RewardRef(name="mean")], registry), retries=0)
    media = torch.stack([torch.full((3, 4, 4), (i + 1) / 10) for i in range(len(sample_ids))])
    ledger.LEDGER.submit(scheduler, tuple(sample_ids), sample_ids, media, ["p"] * len(sample_ids),
                         [{"sid": s} for s in sample_ids])
    return media, scheduler


def custom(mode: str) -> dict:
    return {"custom": {"package": "cosmos-sana", "rewards": [{"name": "mean"}], "reward_runtime": {"mode": mode}}}


def test_single_completions_take_the_prompts_ids_in_order_each_once(recording_scorers):
    scorers, registry = recording_scorers
    ids = ["unit/a", "unit/b"]
    media, scheduler = submitted(registry, ids)
    fn, prompt = CosmosRewardFn(registry), ledger.tagged("p", ids)
    with scheduler:
        total, parts = fn(media[0], None, config=custom("async"), prompt=prompt)
        assert (total, parts) == (pytest.approx(0.1), {"mean": pytest.approx(0.1)})
        assert fn(media[1], None, config=custom("async"), prompt=prompt)[0] == pytest.approx(0.2)
        with pytest.raises(ledger.UnknownSampleError, match=r"samples \['unit/a', 'unit/b'\].*taken already"):
            fn(media[1], None, config=custom("async"), prompt=prompt)
    assert dict(scorers.calls) == {("mean", "unit/a"): 1, ("mean", "unit/b"): 1}
    assert not ledger.LEDGER.known(ids)


def test_a_group_takes_its_ids_by_position(recording_scorers):
    _, registry = recording_scorers
    ids = ["group/a", "group/b", "group/c"]
    media, scheduler = submitted(registry, ids)
    with scheduler:
        totals, parts = CosmosRewardFn(registry)(list(media), None, config=custom("async"), prompt=ledger.tagged("p", ids))
    assert totals == pytest.approx([0.1, 0.2, 0.3])
    assert [p["mean"] for p in parts] == pytest.approx([0.1, 0.2, 0.3])
    assert not ledger.LEDGER.known(ids)


@pytest.mark.parametrize("grouped", [False, True], ids=["per-sample", "group"])
def test_a_copied_completion_gets_the_reward_of_its_position(grouped, recording_scorers):
    """A copy lives at another address; its reward follows its position, not where its data lives."""
    _, registry = recording_scorers
    ids = [f"copy{grouped}/a", f"copy{grouped}/b"]
    media, scheduler = submitted(registry, ids)
    copies = [row.clone() for row in media]
    assert all(c.data_ptr() != row.data_ptr() for c, row in zip(copies, media))
    fn, prompt = CosmosRewardFn(registry), ledger.tagged("p", ids)
    with scheduler:
        if grouped:
            totals = fn(copies, None, config=custom("async"), prompt=prompt)[0]
        else:
            totals = [fn(c, None, config=custom("async"), prompt=prompt)[0] for c in copies]
    assert totals == pytest.approx([0.1, 0.2])


def test_a_group_of_the_wrong_size_is_refused_naming_the_prompts_ids(recording_scorers):
    _, registry = recording_scorers
    ids = ["size/a", "size/b"]
    media, scheduler = submitted(registry, ids)
    fn, prompt = CosmosRewardFn(registry), ledger.tagged("p", ids)
    with scheduler:
        with pytest.raises(ValueError, match=r"got 1 completions for a prompt whose 2 samples are \['size/a', 'size/b'\]"):
            fn([media[0]], None, config=custom("async"), prompt=prompt)
        assert ledger.LEDGER.known(ids)  # nothing was taken: the whole group is still there
        assert fn(list(media), None, config=custom("async"), prompt=prompt)[0] == pytest.approx([0.1, 0.2])


def test_a_group_with_a_taken_id_is_refused_naming_it(recording_scorers):
    _, registry = recording_scorers
    ids = ["taken/a", "taken/b"]
    media, scheduler = submitted(registry, ids)
    fn, prompt = CosmosRewardFn(registry), ledger.tagged("p", ids)
    with scheduler:
        assert fn(media[0], None, config=custom("async"), prompt=prompt)[0] == pytest.approx(0.1)
        with pytest.raises(ledger.UnknownSampleError, match=r"samples \['taken/a'\] \(of \['taken/a', 'taken/b'\]\).*taken already"):
            fn(list(media), None, config=custom("async"), prompt=prompt)
        assert ledger.LEDGER.known(["taken/b"])  # a refused group takes nothing
        assert fn(media[1], None, config=custom("async"), prompt=prompt)[0] == pytest.approx(0.2)


def test_an_id_never_submitted_is_an_error_in_async_mode_and_scored_inline_in_sync_mode(recording_scorers):
    _, registry = recording_scorers
    image, prompt = torch.full((3, 4, 4), 0.3), ledger.tagged("p", ["ghost/0"])
    with pytest.raises(ledger.UnknownSampleError, match=r"samples \['ghost/0'\], which were never submitted"):
        CosmosRewardFn(registry)(image, None, config=custom("async"), prompt=prompt)
    assert CosmosRewardFn(registry)(image, None, config=custom("sync"), prompt=prompt)[0] == pytest.approx(0.3)


def test_local_loop_trains_on_the_same_rewards_in_both_modes(
    tiny_image_pipeline_dir, tmp_path, cosmos_registries, recording_scorers, fresh_schedulers
):
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    scorers, registry = recording_scorers
    steps, rewards = 2, {}
    for mode in ("sync", "async"):
        config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path / mode, {
            "train.ckpt.enable_checkpoint": False,
            "custom.rewards": [{"name": "mean"}, {"name": "jpeg_compressibility"}],
            "custom.reward_runtime": {"mode": mode},
            "rollout.n_generation_mini_batch": 4,
        })
        trainer, rollout = build_components(config)
        rollout.registry = registry
        scorers.calls.clear()
        rewards[mode] = [r["reward/mean"] for r in run_local(config, steps, (trainer, rollout))]
        assert sum(scorers.calls.values()) == steps * config.train.train_batch_per_replica  # each sample once
    assert rewards["async"] == rewards["sync"]
