"""Fault injection, training: NaN/inf losses and gradients, and non-finite weights at a checkpoint.

The RL case is the real path of a NaN reward weight: every reward of the step is NaN, so are the
advantages, the loss and the gradients. The step must stop before the optimizer touches a weight,
naming the step and the loss term (or, with ``on_non_finite = "skip"``, drop the update and count
it); no checkpoint may ever be written, let alone marked COMPLETE, over non-finite weights.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from fixtures_trainers import build_rollout, build_trainer, recipe, scored_rollouts

from cosmos_sana.checkpoint import CheckpointError, ModelState, OptimizerState, find_latest, save_checkpoint
from cosmos_sana.cli import main
from cosmos_sana_plugins.trainers.finite import NonFiniteStep

pytestmark = pytest.mark.usefixtures("torch_single_thread")

PROMPTS = ["a red cube", "a blue sky"]
ONE_STEP = {"policy.diffusers.timesteps_fraction": 0.25, "train.train_policy.mini_batch": 8, "train.optm_lr": 1e-4}


def weights(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.transformer.named_parameters()}


def unchanged(before: dict[str, torch.Tensor], trainer) -> bool:
    return all(torch.equal(before[n], p) for n, p in trainer.model.transformer.named_parameters())


def grpo(tmp_path: Path, pipeline: Path, **overrides):
    config = recipe("sana-image-grpo", pipeline, tmp_path, {**ONE_STEP, **overrides})
    trainer = build_trainer(config)
    return trainer, build_rollout(config, trainer.model)


def nan_weighted(media: torch.Tensor) -> list[float]:
    """What a reward of weight NaN contributes: NaN for every sample."""
    return [float("nan")] * media.shape[0]


def bright(media: torch.Tensor) -> list[float]:
    return media.flatten(1).mean(1).tolist()


@pytest.mark.fault("refused", guards_data=True)
def test_nan_reward_stops_the_rl_step_before_any_weight_changes(
    tiny_image_pipeline_dir: Path, tmp_path: Path, cosmos_registries
) -> None:
    trainer, rollout = grpo(tmp_path, tiny_image_pipeline_dir)
    before = weights(trainer)
    rollouts = scored_rollouts(rollout, PROMPTS, nan_weighted)
    with pytest.raises(NonFiniteStep, match=r"^step 3: non-finite loss terms 'loss' = nan, 'policy_loss' = nan") as info:
        trainer.step_training(rollouts, current_step=3, total_steps=5, do_save_checkpoint=True)
    assert "non-finite gradients" in str(info.value) and 'on_non_finite = "skip"' in str(info.value)
    assert unchanged(before, trainer) and trainer.optimizer_updates == 0
    assert not (trainer.output_dir / "checkpoints").exists()  # nothing saved for the step


@pytest.mark.fault("contained")
def test_skip_drops_the_update_counts_it_and_training_goes_on(
    tiny_image_pipeline_dir: Path, tmp_path: Path, cosmos_registries
) -> None:
    trainer, rollout = grpo(tmp_path, tiny_image_pipeline_dir, **{"custom.trainer.on_non_finite": "skip"})
    before = weights(trainer)
    report = trainer.step_training(scored_rollouts(rollout, PROMPTS, nan_weighted), current_step=1, total_steps=3)
    assert report["train/skipped_updates"] == 1.0 and math.isnan(report["train/loss"])
    assert unchanged(before, trainer) and trainer.optimizer_updates == 0
    report = trainer.step_training(scored_rollouts(rollout, PROMPTS, bright, first_index=2), current_step=2, total_steps=3)
    assert report["train/skipped_updates"] == 1.0 and math.isfinite(report["train/loss"])
    assert not unchanged(before, trainer) and trainer.optimizer_updates == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.transformer.parameters())
    trainer.save_training_state(2)  # a finite model saves normally
    assert find_latest(trainer.output_dir).name == "iter_000000002"


@pytest.mark.fault("refused", guards_data=True)
@pytest.mark.parametrize("bad", ["inf", "nan"])
def test_non_finite_gradient_names_the_parameter(
    tiny_image_pipeline_dir: Path, tmp_path: Path, cosmos_registries, bad: str
) -> None:
    """The loss is finite; the last trainable parameter's gradient is made infinite or NaN by a hook
    (the injected fault). Gradient clipping multiplies every gradient by ``max_norm / norm``, which is
    NaN when the norm is: the parameter must be found before that, or the first of all would be named."""
    trainer, rollout = grpo(tmp_path, tiny_image_pipeline_dir)
    name, param = [(n, p) for n, p in trainer.model.transformer.named_parameters() if p.requires_grad][-1]
    param.register_hook(lambda grad: grad * float(bad))
    before = weights(trainer)
    with pytest.raises(NonFiniteStep) as info:
        trainer.step_training(scored_rollouts(rollout, PROMPTS, bright), current_step=1, total_steps=2)
    message = str(info.value)
    assert message.startswith(f"step 1: non-finite gradients (total norm {bad}, first in {name!r})"), message
    assert "loss term" not in message
    assert unchanged(before, trainer)


def linear_parts(seed: int) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, {"model": ModelState(model), "optim": OptimizerState(model, [optimizer])}


@pytest.mark.fault("refused", guards_data=True)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_checkpoint_over_non_finite_weights_is_never_written(tmp_path: Path, value: float) -> None:
    model, parts = linear_parts(0)
    good = save_checkpoint(tmp_path, 1, parts)
    saved = {p.relative_to(good): p.read_bytes() for p in good.rglob("*") if p.is_file()}
    with torch.no_grad():
        model.weight[1, 2] = value
    with pytest.raises(CheckpointError, match=r"iter_0+2: not saved: part 'model' entry 'weight' holds NaN or inf"):
        save_checkpoint(tmp_path, 2, parts)
    assert find_latest(tmp_path) == good
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [good.name]  # no partial folder
    assert {p.relative_to(good): p.read_bytes() for p in good.rglob("*") if p.is_file()} == saved


@pytest.mark.fault("refused", guards_data=True)
def test_convert_refuses_a_pipeline_with_nan_weights(tiny_image_pipeline_dir: Path, tmp_path: Path, capsys) -> None:
    from safetensors.torch import load_file, save_file

    pipeline = tmp_path / "pipeline"
    shutil.copytree(tiny_image_pipeline_dir, pipeline)
    weights_file = next((pipeline / "transformer").glob("*.safetensors"))
    tensors = load_file(weights_file)
    key = sorted(k for k, t in tensors.items() if t.is_floating_point())[0]
    tensors[key][0] = float("nan")
    save_file(tensors, weights_file)
    out = tmp_path / "dcp"
    assert main(["convert-to-dcp", str(pipeline), "--out", str(out)]) == 1
    assert f"weight {key!r} holds NaN or inf" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.fault("refused", guards_data=True)
def test_nan_sft_loss_stops_the_step(
    tiny_image_pipeline_dir: Path, tmp_path: Path, cosmos_registries, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow-matching loss of one micro-batch is made NaN (the injected fault)."""
    from PIL import Image

    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory
    from cosmos_sana_plugins.trainers import sft

    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        Image.new("RGB", (32, 32), (60 * i, 90, 30)).save(data / f"s{i}.png")
        (data / f"s{i}.txt").write_text(f"colour {i}")
    ref = {"name": "images", "args": {"path": str(data)}}
    config = recipe("sana-image-sft", tiny_image_pipeline_dir, tmp_path / "out", {"custom.data": ref, "custom.val_data": ref})
    trainer = build_trainer(config)
    dataset = dataset_factory(installed_plugins(), "data")(config)
    batch = [trainer.data_packer.sft_process_sample(dataset[i]) for i in range(len(dataset))]
    real_loss = sft.flow_matching_per_sample
    monkeypatch.setattr(sft, "flow_matching_per_sample", lambda *a: real_loss(*a) * float("nan"))
    before = weights(trainer)
    with pytest.raises(NonFiniteStep, match=r"^step 5: non-finite loss term 'loss' = nan"):
        trainer.step_training(batch, total_steps=10, train_step=4, save_freq=10)
    assert unchanged(before, trainer) and trainer.optimizer_updates == 0


AGREE = """
import json, sys
import torch, torch.distributed as dist
from cosmos_sana.checkpoint.dcp_io import any_rank
from cosmos_sana_plugins.trainers.finite import non_finite_problem

dist.init_process_group("gloo")
rank = dist.get_rank()
weight = torch.nn.Parameter(torch.ones(2))
weight.grad = torch.ones(2)
loss = torch.tensor([float("nan") if rank == 1 else 0.5])  # a metric-only term, NaN on rank 1 alone
problem = non_finite_problem(torch.tensor(1.0), {"loss": loss}, [("w", weight)])
result = json.dumps({"rank": rank, "problem": problem, "any": any_rank(rank == 1)})
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as handle:  # two ranks' stdout lines can interleave
    handle.write(result)
"""


@pytest.mark.fault("refused")
def test_ranks_agree_on_a_non_finite_step(tmp_path: Path) -> None:
    """A NaN seen by one rank stops every rank (a rank going on alone would hang the next collective)."""
    import json

    from fixtures_ranks import run_two_ranks

    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    run_two_ranks(script, tmp_path, timeout=300)
    lines = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["any"] for r in lines] == [True, True]
    assert lines[0]["problem"] == "non-finite loss term 'loss' (on another rank)"
    assert lines[1]["problem"] == "non-finite loss term 'loss' = nan (summed over this rank's samples)"


@pytest.mark.parametrize("clip", [0.5, 0.0])
def test_optimizer_step_clips_to_the_norm_it_checked(
    tiny_image_pipeline_dir: Path, tmp_path: Path, cosmos_registries, clip: float
) -> None:
    """Not a fault case: the norm is taken before clipping, and the gradients the optimizer sees are
    scaled to ``optm_grad_norm_clip`` (untouched with 0)."""
    trainer, _ = grpo(tmp_path, tiny_image_pipeline_dir, **{"train.optm_grad_norm_clip": clip})
    params = trainer.trainable_params
    for param in params:
        param.grad = torch.full_like(param, 3.0)
    expected = 3.0 * math.sqrt(sum(p.numel() for p in params))
    seen: list[float] = []
    trainer.optimizers.step = lambda: seen.append(float(torch.stack([p.grad.norm() for p in params]).norm()))
    assert trainer.optimizer_step(step=1) == pytest.approx(expected, rel=1e-5)
    assert seen == [pytest.approx(clip if clip > 0 else expected, rel=1e-4)]
