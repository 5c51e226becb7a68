"""Two data-parallel ranks (FSDP2 over gloo on CPU, sharded by cosmos-rl's own ``parallelize``).

* RL: the colocated loop (rollout, reward, Diffusion-NFT step with LoRA ``default``/``old``, EMA, DCP
  checkpoint, final export). FSDP averages the ranks' gradients, so identical weights on both ranks
  after different local batches show the reduction ran.
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
    from test_trainer_fsdp import use_cpu_mesh
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
    before = {k: v.full_tensor().clone() for k, v in trainer.model.transformer.named_parameters() if v.requires_grad}
    reports = run_local(config, 2, (trainer, rollout))
    trainer.save_checkpoint(2, 2, 0, is_final=True)  # DCP from both ranks + the final LoRA export
    full = StateDictOptions(full_state_dict=True)  # every rank gets the full tensors
    state = get_model_state_dict(trainer.model.transformer, options=full)
    lora = {k: v for k, v in state.items() if "lora_" in k}
    ema = {k: v.full_tensor() for k, v in trainer.ema.shadow.items()}
    torch.save({"lora": lora, "ema": ema, "before": before, "reports": reports}, f"{out}/rank{rank}.pt")
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
    torch.save({k: v for k, v in state.items() if "lora_" in k}, f"{out}/sft_rank{rank}.pt")
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
    lora0, lora1 = ranks[0]["lora"], ranks[1]["lora"]
    assert lora0 and lora0.keys() == lora1.keys()
    assert any("lora_A.old" in k for k in lora0) and any("lora_A.default" in k for k in lora0)
    for key in lora0:
        assert torch.equal(lora0[key], lora1[key]), key
    for key, value in ranks[0]["ema"].items():
        assert torch.equal(value, ranks[1]["ema"][key]), key
    # training moved the trained adapter, and both ranks moved it the same way
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
    ranks = [torch.load(tmp_path / f"sft_rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() == single.keys()
    assert any(not torch.equal(before[k], single[k]) for k in single)
    for key, value in single.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), key
        torch.testing.assert_close(ranks[0][key], value, rtol=1e-5, atol=1e-6, msg=key)
    # rank 0 exported the final LoRA from the checkpoint both ranks wrote
    assert (tmp_path / "dp2" / "out" / "safetensors" / "step_1" / "pytorch_lora_weights.safetensors").is_file()
