"""LoRA data parallelism by replication (``[custom.model] lora_data_parallel = "replicate"``) against
FSDP2 sharding, on two gloo ranks: two Diffusion-NFT steps of the tiny recipe per placement, weight
all-gathers and all-reduces counted per phase of the second step, DCP checkpoints resumed.

Replication must train the same LoRA weights as FSDP (both average the ranks' gradients), keep both
replicas bit-identical, gather no weights at all, and write checkpoints FSDP runs can resume from and
vice versa. ``train.fsdp_reshard_after_forward = "never"`` must gather each sharded module once per
rollout and once per training micro-step instead of once per forward, and an EMA forward before each
step (as validation runs) must leave no stale gathered weights behind."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from test_trainer_fsdp import run_two_ranks

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    sys.path.insert(0, sys.argv[3])
    from fixtures_trainers import recipe
    from test_trainer_fsdp import use_cpu_mesh
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    pipeline, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    use_cpu_mesh()
    calls, where = {}, ["setup"]

    def counted(op, fn):
        def wrapper(*args, **kwargs):
            calls[(where[0], op)] = calls.get((where[0], op), 0) + 1
            return fn(*args, **kwargs)
        return wrapper

    # FSDP2 gathers weights with dist.all_gather_into_tensor; replication averages with dist.all_reduce
    dist.all_gather_into_tensor = counted("all_gather", dist.all_gather_into_tensor)
    dist.all_reduce = counted("all_reduce", dist.all_reduce)

    def in_phase(name, fn, trainer):
        def wrapper(*args, **kwargs):
            step = len([k for k in calls if k[1] == "step"]) + 1
            if name == "train":  # an EMA forward first, as validation between steps runs
                where[0] = "eval"
                with torch.no_grad(), trainer.ema_weights():
                    model = trainer.model
                    model.velocity(torch.ones(1, *model.latent_shape(32, 32)), torch.tensor(0.5),
                                   model.encode_text(["a red cube"]))
            where[0] = f"{name}{step}"
            try:
                return fn(*args, **kwargs)
            finally:
                if name == "train":
                    calls[(f"train{step}", "step")] = 1
                where[0] = "other"
        return wrapper

    def lora(trainer):
        state = get_model_state_dict(trainer.model.transformer, options=StateDictOptions(full_state_dict=True))
        return {k: v.clone() for k, v in state.items() if "lora_" in k}

    def gathering_modules(transformer):  # FSDP modules with weights of their own: one all-gather each
        sharded = [m for m in transformer.modules() if isinstance(m, FSDPModule)]
        def nested(m):
            return {id(p) for c in m.modules() if c is not m and isinstance(c, FSDPModule) for p in c.parameters()}
        return sum(any(id(p) not in nested(m) for p in m.parameters()) for m in sharded)

    def run(name, placement, reshard, resume=False):
        calls.clear()
        overrides = {
            "policy.parallelism.dp_shard_size": 2, "rollout.parallelism.dp_shard_size": 2,
            "train.ckpt.save_freq": 1, "custom.model.lora_data_parallel": placement,
            "train.ema_enable": True, "train.ema_decay": 0.5,
            "train.fsdp_reshard_after_forward": reshard, "train.resume": resume,
            # Adam's first steps are ~lr·sign(grad), which turns rounding-level differences of tiny
            # gradients into whole steps and cannot see a gradient summed instead of averaged; with
            # eps ≫ |grad| an update is ~lr·grad/eps (as in test_trainer_fsdp's SFT comparison)
            "train.optm_lr": 1.0, "train.epsilon": 1.0, "train.optm_grad_norm_clip": 0.0,
        }
        config = recipe("sana-image-nft", pipeline, out / name, overrides)
        trainer, rollout = build_components(config)
        start = lora(trainer)
        rollout.rollout_generation = in_phase("rollout", rollout.rollout_generation, trainer)
        trainer.step_training = in_phase("train", trainer.step_training, trainer)
        reports = run_local(config, 2, (trainer, rollout))
        return {"start": start, "end": lora(trainer), "calls": dict(calls),
                "gathering_modules": gathering_modules(trainer.model.transformer),
                "rewards": [r["reward/mean"] for r in reports]}

    results = {name: run(name, placement, reshard) for name, placement, reshard in
               (("fsdp", "fsdp", "default"), ("never", "fsdp", "never"), ("replicate", "replicate", "default"))}
    for source in ("replicate", "fsdp"):  # step 2 again from each run's step-1 checkpoint, replicated
        step1 = next((out / source).rglob("iter_000000001"))
        results[f"resume-{source}"] = run(f"resume-{source}", "replicate", "default", resume=str(step1))
    step1 = next((out / "replicate").rglob("iter_000000001"))  # and the replicated checkpoint, sharded
    results["fsdp-resume-replicate"] = run("fsdp-resume-replicate", "fsdp", "default", resume=str(step1))
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> list[dict]:
    out = tmp_path_factory.mktemp("replicate")
    run_two_ranks(WORKER, tiny_image_pipeline_dir, out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def assert_lora_close(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_replicated_lora_trains_like_fsdp_and_stays_identical_on_both_ranks(ranks: list[dict]) -> None:
    replicate, fsdp = ranks[0]["replicate"], ranks[0]["fsdp"]
    assert any(".default." in k for k in replicate["end"]) and any(".old." in k for k in replicate["end"])
    # the ranks sampled different rollouts (rank-derived seeds), so their gradients differed
    assert ranks[0]["replicate"]["rewards"] != ranks[1]["replicate"]["rewards"]
    # both adapters moved (default by the optimizer, old by the NFT blend) ...
    moved = [k for k in replicate["end"] if not torch.equal(replicate["start"][k], replicate["end"][k])]
    assert any(".default." in k for k in moved) and any(".old." in k for k in moved)
    # ... identically on both replicas, bit for bit
    for key, value in replicate["end"].items():
        assert torch.equal(value, ranks[1]["replicate"]["end"][key]), key
    # and to the weights FSDP trains from the same start (FSDP averages its shards' gradients)
    assert_lora_close(replicate["start"], fsdp["start"])
    assert_lora_close(replicate["end"], fsdp["end"])
    assert_lora_close(ranks[0]["never"]["end"], fsdp["end"])


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_checkpoints_resume_across_placements(ranks: list[dict]) -> None:
    for rank in ranks:
        # step 2 from the replicated run's own step-1 DCP checkpoint: exactly the uninterrupted step 2
        for key, value in rank["replicate"]["end"].items():
            assert torch.equal(rank["resume-replicate"]["end"][key], value), key
        # the FSDP run's (sharded) checkpoint loads into a replicated model, which then trains like FSDP
        assert_lora_close(rank["resume-fsdp"]["end"], rank["fsdp"]["end"])
        # and the replicated run's checkpoint into a sharded model
        assert_lora_close(rank["fsdp-resume-replicate"]["end"], rank["replicate"]["end"])


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_weight_all_gathers_per_nft_step(ranks: list[dict]) -> None:
    """Counts of the second step (the tiny recipe: 8 samples a rank in one rollout batch of 4 sampling
    steps; training on K = int(4 · 0.6) = 2 of them per sample in one mini-batch, one optimizer step;
    each training micro-step runs the old, reference and current forwards and one backward)."""
    sampling_forwards, micro_steps = 4, 2
    for rank in ranks:
        fsdp, never, replicate = rank["fsdp"], rank["never"], rank["replicate"]
        groups = fsdp["gathering_modules"]  # the 2 blocks, the root and patch_embed
        assert groups == 4 and never["gathering_modules"] == groups and replicate["gathering_modules"] == 0

        def count(run: dict, phase: str, op: str) -> int:
            return run["calls"].get((f"{phase}2", op), 0)

        # cosmos-rl's sharding: every forward gathers every sharded module, and every backward again
        assert count(fsdp, "rollout", "all_gather") == groups * sampling_forwards
        assert count(fsdp, "train", "all_gather") == groups * micro_steps * (3 + 1)
        # "never": gathered once for the whole rollout, then once per micro-step (the backward reshards)
        assert count(never, "rollout", "all_gather") == groups
        assert count(never, "train", "all_gather") == groups * micro_steps
        # replication: no weight is ever gathered; one gradient all-reduce per optimizer step
        assert count(replicate, "rollout", "all_gather") == 0
        assert count(replicate, "train", "all_gather") == 0
        # the step's other all-reduces (image guards, finite check, checkpoint flag) are the same in both
        assert count(replicate, "train", "all_reduce") == count(fsdp, "train", "all_reduce") + 1
        assert count(replicate, "rollout", "all_reduce") == 0


def test_replicate_is_refused_for_full_parameter_training() -> None:
    from cosmos_sana.plugin_manager import load_plugins
    from cosmos_sana.validation import ConfigInvalid, validate_file

    with pytest.raises(ConfigInvalid) as info:
        validate_file(ROOT / "toml" / "tiny" / "sana-image-sft.toml", ['custom.model.lora_data_parallel="replicate"'],
                      registry=load_plugins())
    message = str(info.value)
    assert 'custom.model.lora_data_parallel = "replicate" needs LoRA ([policy.lora])' in message
    assert 'use "fsdp"' in message
    # the same recipe with LoRA, and the default placement without, are fine
    validate_file(ROOT / "toml" / "tiny" / "sana-image-sft-lora.toml", ['custom.model.lora_data_parallel="replicate"'],
                  registry=load_plugins())
    validate_file(ROOT / "toml" / "tiny" / "sana-image-sft.toml", registry=load_plugins())


def test_unknown_placement_is_named() -> None:
    from cosmos_sana.plugin_manager import load_plugins
    from cosmos_sana.validation import ConfigInvalid, validate_file

    with pytest.raises(ConfigInvalid, match=r"custom.model.lora_data_parallel"):
        validate_file(ROOT / "toml" / "tiny" / "sana-image-nft.toml", ['custom.model.lora_data_parallel="ddp"'],
                      registry=load_plugins())


SFT_WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist

    sys.path.insert(0, sys.argv[3])
    from fixtures_trainers import build_trainer
    from test_trainer_fsdp import fixed_noise_sft, sft_setup, use_cpu_mesh

    pipeline, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    use_cpu_mesh()
    fixed_noise_sft()
    config, batch = sft_setup(pipeline, out, dp=2)
    config.custom.setdefault("model", {})["lora_data_parallel"] = "replicate"
    trainer = build_trainer(config)
    trainer.step_training(batch[2 * rank : 2 * rank + 2], total_steps=1, train_step=0, save_freq=10)
    lora = {k: v.detach().clone() for k, v in trainer.model.transformer.named_parameters() if "lora_" in k}
    torch.save(lora, f"{out}/sft_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_replicated_sft_step_equals_one_process_on_the_whole_batch(tmp_path: Path, tiny_image_pipeline_dir: Path,
                                                                  cosmos_registries) -> None:
    """Two replicas with two samples each take the step one process takes on all four (σ and noise fixed)."""
    from test_trainer_fsdp import single_process_sft_step

    run_two_ranks(SFT_WORKER, tiny_image_pipeline_dir, tmp_path)
    before, single = single_process_sft_step(tiny_image_pipeline_dir, tmp_path / "single")
    ranks = [torch.load(tmp_path / f"sft_rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == single.keys()
    assert any(not torch.equal(before[k], single[k]) for k in single)
    for key, value in single.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), key
        torch.testing.assert_close(ranks[0][key], value, rtol=1e-5, atol=1e-6, msg=key)
