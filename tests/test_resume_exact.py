"""What makes a resumed run draw what the uninterrupted run drew: derived seeds, per-step
reseeding, the DDRL real-data position, and the checkpoint comparison that reports it."""

from __future__ import annotations

import hashlib
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fixtures_trainers import build_rollout, build_trainer, payloads, recipe

from cosmos_sana.checkpoint import CheckpointError, save_checkpoint
from cosmos_sana.checkpoint.compare import compare_checkpoints
from cosmos_sana.checkpoint.training import changed_settings
from cosmos_sana.checkpoint.dcp_io import load_state, save_state
from cosmos_sana.seeds import derive_seed
from cosmos_sana_plugins.trainers.base import SanaTrainer
from cosmos_sana_plugins.trainers.ddrl import RealBatches

pytestmark = pytest.mark.usefixtures("torch_single_thread")

PROMPTS = ["a red cube", "a blue sky"]


def test_derive_seed_is_blake2b_of_the_position():
    expected = int.from_bytes(hashlib.blake2b(b"7:rollout:0:3:5", digest_size=8).digest(), "little") % (2**31 - 1)
    assert derive_seed(7, "rollout", 0, 3, 5) == expected
    assert len({derive_seed(7, "rollout", 0, step, k) for step in range(4) for k in range(8)}) == 32


@pytest.fixture(scope="module")
def nft(tiny_image_pipeline_dir, tmp_path_factory, cosmos_registries):
    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path_factory.mktemp("seeds"),
                    {"rollout.n_generation": 2, "policy.diffusers.sample.num_steps": 2,
                     "custom.reward_runtime": {"mode": "sync"}})
    return config, build_trainer(config)


def generate(rollout, trainer, completed_steps: int, is_validation: bool = False):
    trainer.policies.completed_steps = completed_steps  # what the trainer's steps and its resume set
    return rollout.rollout_generation(payloads(PROMPTS), None, None, None, is_validation=is_validation)


def test_a_step_samples_the_same_whatever_ran_before_it(nft):
    """Step 4 (3 steps completed) of a fresh rollout — a resumed run — equals step 4 of a rollout that
    sampled steps 1–3 (step 2 in two calls) and a validation round first; before, the resumed run
    reused step 1's seeds."""
    config, trainer = nft
    ran_through = build_rollout(config, trainer.model)
    first = generate(ran_through, trainer, 0)
    for completed in (1, 1, 2):
        generate(ran_through, trainer, completed)
    generate(ran_through, trainer, 2, is_validation=True)
    expected = generate(ran_through, trainer, 3)
    resumed = generate(build_rollout(config, trainer.model), trainer, 3)
    for a, b in zip(expected, resumed):
        assert torch.equal(a.extra_info["seeds"], b.extra_info["seeds"])
        assert torch.equal(a.extra_info["x0"], b.extra_info["x0"])
    assert not torch.equal(first[0].extra_info["seeds"], resumed[0].extra_info["seeds"])
    seeds = torch.cat([r.extra_info["seeds"] for r in resumed]).tolist()
    assert seeds == [derive_seed(config.train.seed, "rollout", 0, 3, k) for k in range(len(PROMPTS) * 2)]


def test_validation_seeds_repeat_every_round(nft):
    config, trainer = nft
    rollout = build_rollout(config, trainer.model)
    one, two = generate(rollout, trainer, 1, is_validation=True), generate(rollout, trainer, 5, is_validation=True)
    assert [r.extra_info["seeds"].tolist() for r in one] == [r.extra_info["seeds"].tolist() for r in two]


def test_each_training_step_reseeds_every_generator_from_its_number():
    trainer = SimpleNamespace(config=SimpleNamespace(train=SimpleNamespace(seed=3)), global_rank=0)

    def draws():
        return random.random(), float(np.random.rand()), torch.rand(2).tolist()

    SanaTrainer.seed_step(trainer, 5)
    first = draws()
    torch.randn(100), np.random.rand(7), random.random()  # anything drawn in between
    SanaTrainer.seed_step(trainer, 5)
    assert draws() == first
    SanaTrainer.seed_step(trainer, 6)
    assert draws() != first
    trainer.global_rank = 1
    SanaTrainer.seed_step(trainer, 5)
    assert draws() != first


def test_ddrl_real_data_continues_from_a_saved_position(tmp_path):
    dataset = [f"item{i}" for i in range(5)]  # batches of 2: 2, 2, 1 per epoch
    straight = RealBatches(dataset, 2, seed=4)
    expected = [next(straight) for _ in range(7)]
    for epoch in (expected[0:3], expected[3:6]):
        assert sorted(sum(epoch, [])) == dataset  # each epoch visits every item once, in a new order
    assert expected[0:3] != expected[3:6]

    interrupted = RealBatches(dataset, 2, seed=4)
    assert [next(interrupted) for _ in range(4)] == expected[:4]
    save_state(interrupted.state_dict(), tmp_path / "real_data")
    resumed = RealBatches(dataset, 2, seed=4)
    state = resumed.state_dict()
    load_state(state, tmp_path / "real_data")
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(3)] == expected[4:]


def test_compare_reports_the_largest_difference_per_adapter_and_part(tmp_path):
    def parts(delta: float) -> dict:
        return {
            "model": {"blocks.0.to_q.lora_A.default.weight": torch.ones(2, 2),
                      "blocks.0.to_q.lora_A.old.weight": torch.full((2, 2), 2.0) + delta},
            "trainer": {"step": torch.tensor(3), "note": "x"},
        }

    a = save_checkpoint(tmp_path / "a", 3, parts(0.0))
    b = save_checkpoint(tmp_path / "b", 3, parts(0.25))
    same = compare_checkpoints(a, tmp_path / "a")  # a run folder means its latest checkpoint
    assert same["bit_identical"] and same["b"] == str(a)
    report = compare_checkpoints(a, b)
    assert not report["bit_identical"]
    groups = report["groups"]
    assert groups["model/lora_default"] == {"entries": 1, "differing": 0, "max_abs_diff": 0.0, "bit_identical": True}
    assert groups["model/lora_old"] == {"entries": 1, "differing": 1, "max_abs_diff": 0.25, "bit_identical": False}
    assert groups["trainer"]["bit_identical"] and groups["trainer"]["entries"] == 2
    json.dumps(report)  # what the script prints


def test_a_resume_names_the_settings_that_differ_from_the_checkpointed_run(tmp_path):
    written = {"train": {"output_dir": "/runs/a/1", "timestamp": "1", "resume": False, "optm_lr": 1e-3},
               "custom": {"data": {"name": "prompts"}}}
    path = save_checkpoint(tmp_path, 3, {"trainer": {"step": torch.tensor(3)}}, config=written)
    same_run = {"train": {"output_dir": "/runs/a/2", "timestamp": "2", "resume": True, "optm_lr": 1e-3},
                "custom": {"data": {"name": "prompts"}}}
    assert changed_settings(path, same_run) == []
    other = {"train": {**same_run["train"], "optm_lr": 2e-3}, "custom": {"data": {"name": "prompts", "extra": 1}}}
    assert changed_settings(path, other) == ["custom.data.extra", "train.optm_lr"]
    (path / "run_config.json").unlink()
    with pytest.raises(CheckpointError, match="run_config.json"):
        changed_settings(path, same_run)


@pytest.mark.parametrize(
    ("schedule", "named"),
    [
        ({}, []),  # constant rate: a longer run trains its first steps alike
        ({"optm_decay_type": "none", "optm_warmup_steps": 0.0}, []),
        ({"optm_decay_type": "cosine"}, ["train.max_num_steps"]),  # the decay spans the run
        ({"optm_warmup_steps": 5}, ["train.max_num_steps"]),  # a warm-up is capped by the total
        ({"optm_warmup_steps": 0.1}, ["train.max_num_steps"]),  # ... or a share of it
    ],
)
def test_a_longer_run_is_named_only_when_the_schedule_spans_the_run(tmp_path, schedule, named):
    written = {"train": {"max_num_steps": 2, "optm_decay_type": None, "optm_warmup_steps": 0, **schedule}}
    path = save_checkpoint(tmp_path, 2, {"trainer": {"step": torch.tensor(2)}}, config=written)
    assert changed_settings(path, {"train": {**written["train"], "max_num_steps": 3}}) == named
