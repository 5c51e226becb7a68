"""``[custom.rollout.speed]`` on two FSDP2 ranks (gloo on CPU), as the shipped recipes run it.

Colocated, the rollout installs the speed features on the policy model the trainer shards, so the
sampler and the trainer's forward and backward run through ``torch.compile``'d blocks that FSDP2
wraps, and the text key/value cache reads FSDP-sharded weights. For Diffusion-NFT and Flow-GRPO
(gradient checkpointing as their shipped recipes set it), each rank takes two steps with the
features on and two with them off (same seeds); both must train the same model."""

from __future__ import annotations

import math
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
import fixtures_ranks

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_single_thread")]

#: the shipped recipes' table, except the backend: "aot_eager" runs the same Dynamo capture of each
#: FSDP-wrapped block (guards, recompiles per grad mode and adapter, FSDP2's hooks left out of the
#: graph) and the same AOTAutograd joint forward/backward graphs as "inductor", without Inductor's
#: C++ code generation. With "inductor" both cases pass too, but on a 2-core CPU each takes ~30 s with
#: a warm compile cache and NFT ~85 s with a cold one, against ~15 s.
SPEED = {"linear_attention": "bf16", "cache_text_kv": True, "compile_blocks": True, "compile_backend": "aot_eager"}
STEPS = 2
#: recipe → policy.model_gradient_checkpointing, as in toml/sana-image-nft.toml and toml/sana-image-grpo.toml
SHIPPED = {"sana-image-nft": False, "sana-image-grpo": True}

WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist

    sys.path.insert(0, sys.argv[3])
    from test_speed_features_two_ranks import colocated_run
    from test_trainer_fsdp import use_cpu_mesh

    pipeline, out, name = sys.argv[1], sys.argv[2], sys.argv[4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    use_cpu_mesh()
    runs = {speed: colocated_run(name, pipeline, f"{out}/{speed}", rank, speed == "on") for speed in ("off", "on")}
    torch.save(runs, f"{out}/rank{rank}.pt")
    dist.barrier()  # tear down together: a rank leaving early aborts the other in gloo
    dist.destroy_process_group()
    """
)


def colocated_run(name: str, pipeline: str, out: str, rank: int, speed: bool) -> dict[str, Any]:
    """``STEPS`` colocated steps of the tiny recipe ``name`` on this rank (its own samples, as on real
    DP ranks) and what shows which code they ran through."""
    from torch._dynamo.utils import counters
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    from fixtures_trainers import recipe
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    overrides: dict[str, Any] = {"policy.parallelism.dp_shard_size": 2, "rollout.parallelism.dp_shard_size": 2,
                                 "train.seed": 1 + rank, "train.ckpt.enable_checkpoint": False,
                                 "policy.model_gradient_checkpointing": SHIPPED[name]}
    if speed:
        overrides["custom.rollout.speed"] = SPEED
    config = recipe(name, pipeline, out, overrides)
    torch.manual_seed(0)  # the same LoRA initialisation in both runs
    counters.clear()
    trainer, rollout = build_components(config)  # the rollout installs the speed features here
    transformer = trainer.model.transformer
    blocks = transformer.transformer_blocks
    before = {k: v.full_tensor().clone() for k, v in transformer.named_parameters() if v.requires_grad}

    compiled_calls = {"grad": 0, "no_grad": 0}  # calls of the blocks' compiled forwards

    def counted(compiled: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            compiled_calls["grad" if torch.is_grad_enabled() else "no_grad"] += 1
            return compiled(*args, **kwargs)

        return call

    for block in blocks:
        if block._compiled_call_impl is not None:
            block._compiled_call_impl = counted(block._compiled_call_impl)
    last_block_outputs: set[str] = set()  # autograd nodes that produced the last block's output in training

    def record(module: Any, args: tuple[Any, ...]) -> None:
        if torch.is_grad_enabled():
            last_block_outputs.add(type(args[0].grad_fn).__name__)

    transformer.norm_out.register_forward_pre_hook(record)  # the module right after the last block
    reports = run_local(config, STEPS, (trainer, rollout))
    full = get_model_state_dict(transformer, options=StateDictOptions(full_state_dict=True))
    return {
        "lr": config.train.optm_lr,
        "reports": reports,
        "before": before,
        "lora_full": {k: v for k, v in full.items() if "lora_" in k},
        "lora_local": {k: v.to_local().clone() for k, v in transformer.named_parameters() if "lora_" in k},
        "blocks": [(isinstance(b, FSDPModule), type(b.attn1.processor).__name__, type(b.attn2.processor).__name__)
                   for b in blocks],
        "compiled_calls": compiled_calls,
        "last_block_outputs": last_block_outputs,
        "text_kv_cached": rollout._fast is not None and rollout._fast._kv.kv is not None,
        "dynamo": {k: dict(v) for k, v in counters.items()},
    }


# Tolerances, speed on against off. The tiny recipes' model is float32, and in a float32 model the bf16
# linear attention runs in the model dtype: the same products and sums as diffusers' processor, grouped
# differently (Kᵀ·V first, the normaliser as one more column). The cached text keys/values are the same
# operations done once, and "aot_eager" runs the same aten operations. So the two runs differ by float32
# rounding only: the losses agree to ≤ 1e-7 relative (measured), and we allow 1e-4 (≈ 1000 float32 ulps).
# A LoRA weight moves by at most ~lr per AdamW step whatever the gradient's scale (step 1 is
# lr·sign(g)); a relative gradient error δ moves the step-2 update by ~lr·δ, so after two steps the
# weights differ by ≲ 2·lr·δ. Allowing δ = 1e-3 gives 2e-5 at the recipes' lr = 1e-2 (measured: ≤ 2.5e-6).
# A real defect (stale or unreduced weights, wrong keys/values, a rank sampling with other weights)
# changes gradients by O(1), hence weights by O(lr), 500× the tolerance. Rewards are JPEG sizes of uint8
# images: one byte is 2e-6 of reward, and rounding-level pixel noise flips at most a few of the 12288
# uint8 values; measured equal.
LOSS_RTOL = 1e-4
GRADIENT_RTOL = 1e-3
REWARD_ATOL = 2e-6
LOSSES = ("train/loss", "train/policy_loss", "train/kl_loss")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_speed_features_train_like_plain_on_two_fsdp_ranks(tmp_path: Path, tiny_image_pipeline_dir: Path,
                                                            name: str) -> None:
    recipe = tomllib.loads((Path(__file__).resolve().parents[1] / "toml" / f"{name}.toml").read_text())
    assert SHIPPED[name] is recipe["policy"]["model_gradient_checkpointing"], name  # the run follows the recipe
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    fixtures_ranks.run_two_ranks(script, tiny_image_pipeline_dir, tmp_path, Path(__file__).resolve().parent, name)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]

    for rank, runs in enumerate(ranks):
        on, off = runs["on"], runs["off"]
        # the features are installed on the FSDP-wrapped blocks and the sampler used the text key/value cache
        assert on["blocks"] == [(True, "Bf16LinearAttnProcessor", "TextKVAttnProcessor")] * len(on["blocks"]), rank
        assert off["blocks"] == [(True, "SanaLinearAttnProcessor2_0", "SanaAttnProcessor2_0")] * len(off["blocks"])
        assert on["text_kv_cached"] and not off["text_kv_cached"], rank
        # sampling and training called every block's compiled forward, and in training the compiled
        # graph (not an eager fallback) made the last block's output, so its backward ran compiled too
        assert on["compiled_calls"]["no_grad"] > 0 and on["compiled_calls"]["grad"] > 0, (rank, on["compiled_calls"])
        assert off["compiled_calls"] == {"grad": 0, "no_grad": 0}, rank
        assert on["last_block_outputs"] == {"CompiledFunctionBackward"}, (rank, on["last_block_outputs"])
        assert "CompiledFunctionBackward" not in off["last_block_outputs"], rank
        dynamo = on["dynamo"]
        assert dynamo["frames"]["ok"] == dynamo["frames"]["total"] > 0, (rank, dynamo)
        assert not sum(dynamo.get("graph_break", {}).values()), (rank, dynamo["graph_break"])

        assert len(on["reports"]) == len(off["reports"]) == STEPS, rank
        for step, (a, b) in enumerate(zip(on["reports"], off["reports"]), start=1):
            losses = [key for key in LOSSES if key in b]
            assert "train/loss" in losses and a.keys() == b.keys(), (rank, step)
            for key in (*losses, "reward/mean"):
                assert math.isfinite(a[key]) and math.isfinite(b[key]), (rank, step, key)
            for key in losses:
                assert a[key] == pytest.approx(b[key], rel=LOSS_RTOL, abs=1e-7), (rank, step, key, a[key], b[key])
            for key in ("reward/mean", "reward/min", "reward/max"):
                assert a[key] == pytest.approx(b[key], rel=0, abs=REWARD_ATOL), (rank, step, key, a[key], b[key])

        # each rank's own shard of the adapters (the trained one, and NFT's old copy) matches the plain run's
        weight_atol = STEPS * on["lr"] * GRADIENT_RTOL
        assert on["lora_local"].keys() == off["lora_local"].keys()
        assert any(".default." in k for k in on["lora_local"])
        assert any(".old." in k for k in on["lora_local"]) == (name == "sana-image-nft")
        for key, value in on["lora_local"].items():
            assert value.numel() > 0, (rank, key)
            torch.testing.assert_close(value, off["lora_local"][key], rtol=0, atol=weight_atol,
                                       msg=f"rank {rank} {key}")
        assert on["before"].keys() == off["before"].keys()
        for key, value in on["before"].items():
            assert torch.equal(value, off["before"][key]), (rank, key)
        moved = max((on["lora_full"][k] - v).abs().max().item() for k, v in on["before"].items())
        assert moved > 100 * weight_atol, moved  # training moved the adapter far more than the tolerance

    # the ranks sampled different prompts and noise (comparing their gathered weights would prove nothing:
    # every rank gathers the same shards; the reduction itself is checked in tests/test_trainer_fsdp.py)
    assert ranks[0]["on"]["reports"][0]["reward/mean"] != ranks[1]["on"]["reports"][0]["reward/mean"]
