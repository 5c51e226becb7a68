"""``[custom.guards]`` streaks are training state: a run resumed mid-streak stops at the step the
uninterrupted run stops at (the streaks travel in the checkpoint's ``guards`` part, real DCP)."""

from __future__ import annotations

import pytest
import torch

from cosmos_sana.checkpoint import load_checkpoint, save_checkpoint
from cosmos_sana.settings import parse_custom
from cosmos_sana_plugins.trainers.guards import RolloutGuards

HIGH = {"guard/periodicity": 0.75, "guard/saturation": 0.95}


def guards(**thresholds: float) -> RolloutGuards:
    options = parse_custom({"package": "cosmos-sana", "guards": {"patience": 3, **thresholds}}).guards
    return RolloutGuards(options, torch.device("cpu"))


def test_a_resumed_run_continues_the_streak(tmp_path):
    first = guards(max_periodicity=0.5, max_saturation=0.9)
    assert [first.check(HIGH, step) for step in (1, 2)] == [None, None]
    path = save_checkpoint(tmp_path, 2, {"guards": first})
    resumed = guards(max_periodicity=0.5, max_saturation=0.9)
    assert load_checkpoint(path, {"guards": resumed}) == 2
    assert resumed.streaks == {"periodicity": 2, "saturation": 2}
    tripped = resumed.check(HIGH, 3)  # the third step over: patience 3 reached, as without the resume
    assert tripped is not None and (tripped.statistic, tripped.step, tripped.streak) == ("saturation", 3, 3)


def test_a_streak_carries_over_only_where_its_threshold_is_unchanged(tmp_path):
    first = guards(max_periodicity=0.5, max_high_freq=0.1)
    first.check({**HIGH, "guard/high_freq": 0.5}, 1)
    path = save_checkpoint(tmp_path, 1, {"guards": first})
    # periodicity unchanged; high_freq's ceiling moved; saturation newly guarded
    resumed = guards(max_periodicity=0.5, max_high_freq=0.2, max_saturation=0.9)
    load_checkpoint(path, {"guards": resumed})
    assert resumed.streaks == {"periodicity": 1, "high_freq": 0, "saturation": 0}


def test_a_run_resumed_mid_streak_stops_where_the_uninterrupted_run_stops(
    tiny_image_pipeline_dir, tmp_path, cosmos_registries
):
    """patience 2, every step over the ceiling: step 1 trains and saves (streak 1); the resumed run
    trips at step 2, as the uninterrupted run does (a streak restarting at 0 would train step 2)."""
    from fixtures_trainers import recipe

    from cosmos_sana.local_run import build_components, train_local
    from cosmos_sana_plugins.trainers.guards import GuardTripped

    overrides = {
        "train.train_batch_per_replica": 4, "train.ckpt.save_freq": 1,
        "custom.guards": {"max_saturation": 1e-6, "patience": 2},
    }
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, overrides)
    assert len(train_local(config, steps=1)) == 1
    resumed = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, {**overrides, "train.resume": True})
    trainer, rollout = build_components(resumed)
    assert trainer.train_step == 1 and trainer.guards.streaks["saturation"] == 1
    with pytest.raises(GuardTripped, match=r"at step 2, above it for 2 consecutive steps"):
        train_local(resumed, (trainer, rollout), steps=3)


def test_a_checkpoint_written_without_guards_resumes_with_them(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    from fixtures_trainers import recipe

    from cosmos_sana.local_run import build_components, train_local

    overrides = {"train.train_batch_per_replica": 4, "train.ckpt.save_freq": 1}
    train_local(recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, overrides), steps=1)
    guarded = {**overrides, "train.resume": True, "custom.guards": {"max_saturation": 0.99, "patience": 3}}
    trainer, _ = build_components(recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, guarded))
    assert trainer.train_step == 1 and trainer.guards.streaks == {"saturation": 0}
