"""Two data-parallel ranks (FSDP2 over gloo on CPU, sharded by cosmos-rl's own ``parallelize``).

* RL: the colocated loop (rollout, reward, Diffusion-NFT step with LoRA ``default``/``old``, EMA, DCP
  checkpoint, final export). That FSDP reduces the gradients over the ranks is shown on each rank's own
  shard (the full weights every rank gathers are the same whether or not it did): the first step, rerun
  with rank 1's loss multiplied by 0, changes rank 0's gradient shard, and leaves rank 1's nonzero.
* SFT: with σ and noise fixed, one step on two ranks of two samples each must equal one step in a
  single process on all four (the data-parallel gradient is the global mean)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import fixtures_ranks

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_single_thread")]

WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sys.path.insert(0, sys.argv[3])
    from fixtures_trainers import recipe
    from test_trainer_fsdp import first_gradient_without_rank1_loss, record_first_gradient, use_cpu_mesh
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    pipeline, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    overrides = {
        "policy.parallelism.dp_shard_size": 2, "rollout.parallelism.dp_shard_size": 2,
        "train.ema_enable": True, "train.ema_decay": 0.5, "train.ckpt.save_freq": 2,
        "train.seed": 1 + rank,  # different samples per rank, as on real DP ranks
    }
    config = recipe("sana-image-nft", pipeline, out, overrides)
    use_cpu_mesh()
    trainer, rollout = build_components(config)
    first_gradient = record_first_gradient(trainer)
    before = {k: v.full_tensor().clone() for k, v in trainer.model.transformer.named_parameters() if v.requires_grad}
    reports = run_local(config, 2, (trainer, rollout))
    trainer.save_checkpoint(2, 2, 0, is_final=True)  # DCP from both ranks + the final LoRA export
    full = StateDictOptions(full_state_dict=True)  # every rank gets the full tensors
    state = get_model_state_dict(trainer.model.transformer, options=full)
    lora = {k: v for k, v in state.items() if "lora_" in k}
    ema = {k: v.full_tensor() for k, v in trainer.ema.shadow.items()}
    rank1_silent = first_gradient_without_rank1_loss(pipeline, f"{out}/rank1_silent", overrides)
    torch.save({"lora": lora, "ema": ema, "before": before, "reports": reports, "first_gradient": first_gradient,
                "rank1_silent": rank1_silent}, f"{out}/rank{rank}.pt")
    dist.barrier()  # tear down together: a rank leaving early aborts the other in gloo
    dist.destroy_process_group()
    """
)


SFT_WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sys.path.insert(0, sys.argv[3])
    from fixtures_trainers import build_trainer
    from test_trainer_fsdp import fixed_noise_sft, sft_setup, use_cpu_mesh

    pipeline, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    use_cpu_mesh()
    fixed_noise_sft()
    config, batch = sft_setup(pipeline, out, dp=2)
    trainer = build_trainer(config)
    trainer.step_training(batch[2 * rank : 2 * rank + 2], total_steps=1, train_step=0, save_freq=10)
    trainer.checkpointing(total_steps=1, train_step=1, save_freq=10, is_last_step=True)
    state = get_model_state_dict(trainer.model.transformer, options=StateDictOptions(full_state_dict=True))
    if rank == 0:  # every rank gathers the same full weights
        torch.save({k: v for k, v in state.items() if "lora_" in k}, f"{out}/sft_rank0.pt")
    dist.barrier()
    dist.destroy_process_group()
    """
)


def use_cpu_mesh() -> None:
    """cosmos-rl's workers build their device mesh on CUDA; here it is built on gloo."""
    from cosmos_rl.utils.parallelism import ParallelDims

    original = ParallelDims.from_config

    def on_cpu(parallelism: Any) -> Any:
        dims = original(parallelism)
        dims.build_mesh(device_type="cpu")
        return dims

    ParallelDims.from_config = on_cpu


def record_first_gradient(trainer: Any) -> dict[str, torch.Tensor | None]:
    """Filled in when ``trainer``'s first optimizer step starts: this rank's shard of each trainable
    gradient (FSDP has reduced the gradients over the ranks by then; None: no gradient reached it)."""
    shards: dict[str, torch.Tensor | None] = {}
    optimizer_step = trainer.optimizer_step

    def recording(*args: Any, **kwargs: Any) -> Any:
        if not shards:
            for name, param in trainer.model.transformer.named_parameters():
                if param.requires_grad:
                    shards[name] = None if param.grad is None else param.grad.to_local().clone()
        return optimizer_step(*args, **kwargs)

    trainer.optimizer_step = recording
    return shards


def first_gradient_without_rank1_loss(pipeline: str, out: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The RL worker's first step again, from the same seeds and so the same weights and rollouts, except
    that rank 1 back-propagates its loss times 0: this rank's shard of the first reduced gradient
    (:func:`record_first_gradient`) and the step's report. Rank 0's own data and gradient are those of
    the first run, so its shard can change only through the reduction over the ranks."""
    import torch.distributed as dist

    from fixtures_trainers import recipe
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    config = recipe("sana-image-nft", pipeline, out, {**overrides, "train.ckpt.enable_checkpoint": False})
    trainer, rollout = build_components(config)
    if dist.get_rank() == 1:
        backward = trainer.backward
        trainer.backward = lambda loss, *, last: backward(loss * 0, last=last)
    shards = record_first_gradient(trainer)
    reports = run_local(config, 1, (trainer, rollout))
    return {"first_gradient": shards, "report": reports[0]}


def fixed_noise_sft() -> None:
    """SFT steps use :func:`test_trainer_sft.fixed_noise_flow_matching` (no random σ or noise)."""
    from test_trainer_sft import fixed_noise_flow_matching

    from cosmos_sana_plugins.trainers import sft

    sft.flow_matching_per_sample = fixed_noise_flow_matching


def sft_setup(pipeline: str | Path, out: str | Path, dp: int) -> tuple[Any, list[Any]]:
    """The tiny LoRA SFT config (``dp`` FSDP ranks, one sample a micro-batch) and its 4-image batch."""
    from test_trainer_sft import image_folder, sft_config

    from cosmos_sana.compat.cosmos_rl import register_all
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory
    from cosmos_sana_plugins.datasets.packer import SanaDataPacker

    register_all(installed_plugins())
    # Adam's first step is ~lr·sign(grad), blind to a gradient summed instead of averaged over ranks;
    # with eps ≫ |grad| it is ~lr·grad/eps, which is not; no clipping either
    overrides = {"policy.parallelism.dp_shard_size": dp, "train.train_policy.mini_batch": 1,
                 "train.ema_enable": False, "validation.enable": False, "train.optm_lr": 1.0,
                 "train.epsilon": 1.0, "train.optm_grad_norm_clip": 0.0}
    config = sft_config("sana-image-sft-lora", pipeline, Path(out) / f"dp{dp}", image_folder(Path(out) / "data"),
                        **overrides)
    packer = SanaDataPacker()
    packer.setup(config)
    dataset = dataset_factory(installed_plugins(), "data")(config)
    return config, [packer.sft_process_sample(dataset[i]) for i in range(len(dataset))]


def single_process_sft_step(pipeline: Path, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The LoRA weights before and after one SFT step that one process takes on the whole 4-image batch
    (σ and noise fixed): the reference the two-rank steps are held to."""
    from fixtures_trainers import build_trainer

    import cosmos_sana_plugins.trainers.sft as sft_module

    real = sft_module.flow_matching_per_sample
    try:
        fixed_noise_sft()
        config, batch = sft_setup(pipeline, out, dp=1)
        trainer = build_trainer(config)
        before = {k: v.detach().clone() for k, v in trainer.model.transformer.named_parameters() if "lora_" in k}
        trainer.step_training(batch, total_steps=1, train_step=0, save_freq=10)
    finally:
        sft_module.flow_matching_per_sample = real
    return before, {k: v.detach() for k, v in trainer.model.transformer.named_parameters() if "lora_" in k}


def norm(tensors: Any) -> torch.Tensor:
    """The 2-norm of ``tensors`` taken as one vector."""
    return torch.cat([t.flatten() for t in tensors]).norm()


def run_two_ranks(worker: str, pipeline: Path, tmp_path: Path) -> None:
    """``worker`` (its args: pipeline, output folder, this tests folder) on 2 ranks under torchrun."""
    script = tmp_path / "worker.py"
    script.write_text(worker)
    fixtures_ranks.run_two_ranks(script, pipeline, tmp_path, Path(__file__).resolve().parent)


def test_two_fsdp_ranks_train_one_model(tmp_path: Path, tiny_image_pipeline_dir: Path) -> None:
    run_two_ranks(WORKER, tiny_image_pipeline_dir, tmp_path)

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    # different local batches: the ranks saw different rewards
    assert ranks[0]["reports"][0]["reward/mean"] != ranks[1]["reports"][0]["reward/mean"]
    for report in ranks[0]["reports"] + ranks[1]["reports"]:
        assert torch.isfinite(torch.tensor(report["train/loss"]))
    # FSDP reduced the gradients over the ranks. Rerun with rank 1's loss times 0 (same rollouts and
    # losses), the first step gives rank 0 another gradient shard: rank 1's gradient reached it; and
    # rank 1 still a nonzero one: rank 0's reached it. Without the reduction the first would be equal,
    # the second 0. (That the reduction averages rather than sums: the SFT test below.)
    # Measured: 0.98 and 0.53 of the normal shard's norm; a missing or rank-local reduction gives 0.
    shards = []
    for rank in (0, 1):
        rerun = ranks[rank]["rank1_silent"]
        for key in ("reward/mean", "train/loss"):
            assert rerun["report"][key] == ranks[rank]["reports"][0][key], (rank, key)
        normal, silent = ranks[rank]["first_gradient"], rerun["first_gradient"]
        assert normal and normal.keys() == silent.keys(), rank
        assert all(normal[k] is not None and silent[k] is not None for k in normal), f"rank {rank}: no gradient"
        shards.append((normal, silent))
    (normal0, silent0), (normal1, silent1) = shards
    changed = norm(normal0[k] - silent0[k] for k in normal0) / norm(normal0.values())
    assert changed > 0.1, f"rank 1's gradient did not reach rank 0's shard: {changed}"
    left = norm(silent1.values()) / norm(normal1.values())
    assert left > 0.1, f"rank 0's gradient did not reach rank 1's shard: {left}"
    lora0 = ranks[0]["lora"]
    assert any("lora_A.old" in k for k in lora0) and any("lora_A.default" in k for k in lora0)
    # training moved the trained adapter
    moved = [k for k, v in ranks[0]["before"].items() if not torch.equal(v, lora0[k])]
    assert moved, "no trainable parameter changed"
    # the step-2 checkpoint was written by both ranks into one DCP folder
    ckpts = sorted(tmp_path.rglob("iter_000000002"))
    assert ckpts, "no checkpoint"
    meta = json.loads((ckpts[0] / "meta.json").read_text())
    assert meta["world_size"] == 2
    # rank 0 exported the EMA of the trained adapter, whole (diffusers LoRA keys)
    from safetensors.torch import load_file

    exported = load_file(tmp_path / "safetensors" / "step_2" / "pytorch_lora_weights.safetensors")
    assert len(exported) == len([k for k in lora0 if ".default." in k])
    scale = 16 / 8  # the recipe's lora_alpha / r, folded into lora_B by the export
    for key, value in exported.items():
        ours = key.removeprefix("transformer.").replace(".weight", ".default.weight")
        expected = ranks[0]["ema"][ours] * (scale if ".lora_B." in key else 1.0)
        assert torch.equal(value, expected.to(value.dtype)), key


def test_two_rank_sft_step_equals_one_process_on_the_whole_batch(tmp_path: Path, tiny_image_pipeline_dir: Path,
                                                                  cosmos_registries) -> None:
    run_two_ranks(SFT_WORKER, tiny_image_pipeline_dir, tmp_path)
    before, single = single_process_sft_step(tiny_image_pipeline_dir, tmp_path / "single")
    gathered = torch.load(tmp_path / "sft_rank0.pt", weights_only=True)  # from both ranks' shards
    assert gathered.keys() == single.keys()
    assert any(not torch.equal(before[k], single[k]) for k in single)
    for key, value in single.items():
        torch.testing.assert_close(gathered[key], value, rtol=1e-5, atol=1e-6, msg=key)
    # rank 0 exported the final LoRA from the checkpoint both ranks wrote
    assert (tmp_path / "dp2" / "out" / "safetensors" / "step_1" / "pytorch_lora_weights.safetensors").is_file()
