"""Two data-parallel ranks (FSDP2 over gloo on CPU, sharded by cosmos-rl's own ``parallelize``) run the
colocated RL loop: rollout, reward, Diffusion-NFT step with LoRA ``default``/``old``, EMA and a DCP
checkpoint. The ranks must end with one model: FSDP averages their gradients, so identical weights on
both ranks after different local batches show the reduction ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_checkpoint_reshard import free_port

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_single_thread")]

WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sys.path.insert(0, sys.argv[3])
    from fixtures_trainers import recipe
    from cosmos_rl.utils.parallelism import ParallelDims
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
    original = ParallelDims.from_config

    def on_cpu(parallelism):  # the workers' mesh, on gloo
        dims = original(parallelism)
        dims.build_mesh(device_type="cpu")
        return dims

    ParallelDims.from_config = on_cpu
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


def test_two_fsdp_ranks_train_one_model(tmp_path: Path, tiny_image_pipeline_dir: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    tests_dir = Path(__file__).resolve().parent
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(script), str(tiny_image_pipeline_dir), str(tmp_path), str(tests_dir)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]

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
    for key, value in exported.items():
        ours = key.removeprefix("transformer.").replace(".weight", ".default.weight")
        assert torch.equal(value, ranks[0]["ema"][ours].to(value.dtype)), key
