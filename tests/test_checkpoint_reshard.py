"""A checkpoint saved by 2 FSDP2 ranks (DTensor shards, gloo on CPU) resumes in 1 process and exports."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from fixtures_ranks import run_two_ranks

from cosmos_sana.checkpoint import ModelState, OptimizerState, RNGState, load_checkpoint, resolve_resume

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_single_thread")]

WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from cosmos_sana.checkpoint import ModelState, OptimizerState, RNGState, save_checkpoint
    from cosmos_sana.tools.tiny import build_transformer
    from cosmos_sana.tools.tiny_presets import PRESETS

    root, reference = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = build_transformer(PRESETS["tiny"])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.transformer_blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)
    for _ in range(2):
        x, text = torch.randn(2, 4, 8, 8), torch.randn(2, 6, 32)
        model(x, encoder_hidden_states=text, timestep=torch.tensor([100.0, 900.0])).sample.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    parts = {"model": ModelState(model), "optim": OptimizerState(model, optimizer), "rng": RNGState()}
    save_checkpoint(root, 2, parts, chunk_size="200B")
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=full)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=full)
    rng = torch.get_rng_state()
    if rank == 0:
        torch.save({"model": model_sd, "optim": optim_sd["state"], "rng": rng}, reference)
    dist.barrier()  # tear down together: a rank leaving early aborts the other in gloo
    dist.destroy_process_group()
    """
)


def test_two_rank_fsdp_checkpoint_resumes_on_one_rank(tmp_path: Path, tiny_image_pipeline_dir: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    reference_file = tmp_path / "reference.pt"
    run_two_ranks(script, tmp_path / "run", reference_file, timeout=300)

    path = resolve_resume(True, tmp_path / "run")
    assert len(list((path / "model").glob("*.distcp"))) > 2  # both ranks wrote their shards, in 200-byte chunks
    from cosmos_sana.tools.tiny import build_transformer
    from cosmos_sana.tools.tiny_presets import PRESETS

    meta = json.loads((path / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["parts"]["model"]["class"] == "SanaTransformer2DModel"
    assert json.loads((path / "config.json").read_text())["_class_name"] == "SanaTransformer2DModel"  # not FSDP…
    torch.manual_seed(123)
    model = build_transformer(PRESETS["tiny"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = load_checkpoint(path, {"model": ModelState(model), "optim": OptimizerState(model, optimizer), "rng": RNGState()})
    assert step == 2

    reference = torch.load(reference_file, weights_only=True)
    state = model.state_dict()
    assert state.keys() == reference["model"].keys()
    assert all(torch.equal(state[k], reference["model"][k]) for k in state)
    optim = OptimizerState(model, optimizer).state_dict()["state"]
    for fqn, entry in reference["optim"].items():
        for name, value in entry.items():
            assert torch.equal(optim[fqn][name], value), f"{fqn}.{name}"
    assert torch.equal(torch.get_rng_state(), reference["rng"])  # rank 0's generator

    from diffusers import SanaPipeline

    from cosmos_sana.export import export_checkpoint

    out = export_checkpoint(tmp_path / "run", tmp_path / "export", base=tiny_image_pipeline_dir)
    exported = SanaPipeline.from_pretrained(out).transformer.state_dict()
    assert all(torch.equal(exported[k], reference["model"][k]) for k in reference["model"])
