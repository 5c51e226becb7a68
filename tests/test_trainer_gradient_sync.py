"""FSDP2 gradient reduce-scatter once per optimizer step (``[custom.model] fsdp_gradient_sync``), on two
gloo ranks: the LoRA weights after two steps equal those of a run that reduce-scatters in every
backward, and the reduce-scatters per optimizer step drop from one per backward to one.

Adam runs with lr 1 and eps 1 (no clipping), where an update is ~lr·grad/eps: an accumulated gradient
scaled wrongly (summed over ranks, or over backwards) moves the weights visibly differently."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from test_trainer_fsdp import run_two_ranks

WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    sys.path.insert(0, sys.argv[3])
    from fixtures_trainers import build_trainer, recipe
    from test_trainer_fsdp import fixed_noise_sft, sft_setup, use_cpu_mesh
    from test_trainer_sft import image_folder, sft_config
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    pipeline, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    use_cpu_mesh()
    events = []  # "rs" per reduce-scatter, "bw" per backward, "opt" per optimizer step, in order

    reduce_scatter = dist.reduce_scatter_tensor  # FSDP2's gradient reduction

    def counted_reduce_scatter(*args, **kwargs):
        events.append("rs")
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_tensor = counted_reduce_scatter

    def record(trainer):
        backward, optimizer_step = trainer.backward, trainer.optimizer_step

        def counted_backward(*args, **kwargs):
            events.append("bw")
            return backward(*args, **kwargs)

        def counted_optimizer_step(*args, **kwargs):
            events.append("opt")
            return optimizer_step(*args, **kwargs)

        trainer.backward, trainer.optimizer_step = counted_backward, counted_optimizer_step

    def per_optimizer_step():  # [(backwards, reduce-scatters)] between consecutive optimizer steps
        counts, backwards, scatters = [], 0, 0
        for event in events:
            if event == "opt":
                counts.append((backwards, scatters))
                backwards = scatters = 0
            else:
                backwards += event == "bw"
                scatters += event == "rs"
        return counts

    def trained_groups(transformer):  # FSDP modules with trainable weights of their own
        sharded = [m for m in transformer.modules() if isinstance(m, FSDPModule)]
        def nested(m):
            return {id(p) for c in m.modules() if c is not m and isinstance(c, FSDPModule) for p in c.parameters()}
        return sum(any(p.requires_grad and id(p) not in nested(m) for p in m.parameters()) for m in sharded)

    def lora(trainer):
        state = get_model_state_dict(trainer.model.transformer, options=StateDictOptions(full_state_dict=True))
        return {k: v.clone() for k, v in state.items() if "lora_" in k}

    def nft(sync):
        events.clear()
        overrides = {
            "policy.parallelism.dp_shard_size": 2, "rollout.parallelism.dp_shard_size": 2,
            "custom.model.fsdp_gradient_sync": sync, "train.ckpt.enable_checkpoint": False,
            # two optimizer steps a training step, each over two mini-batches of two samples
            "train.train_policy.batch_size_per_optimize": 4, "train.train_policy.mini_batch": 2,
            "train.optm_lr": 1.0, "train.epsilon": 1.0, "train.optm_grad_norm_clip": 0.0,
        }
        trainer, rollout = build_components(recipe("sana-image-nft", pipeline, out / f"nft-{sync}", overrides))
        start = lora(trainer)
        record(trainer)
        run_local(trainer.config, 2, (trainer, rollout))
        return {"start": start, "end": lora(trainer), "per_opt": per_optimizer_step(),
                "groups": trained_groups(trainer.model.transformer)}

    def sft(sync, full=False):
        events.clear()
        folder = out / f"rank{rank}" / f"sft-{sync}-{full}"  # each rank writes its own image files
        config, batch = sft_setup(pipeline, folder, dp=2)
        if full:  # the full-parameter recipe on the same images, one a micro-batch
            overrides = {"policy.parallelism.dp_shard_size": 2, "train.train_policy.mini_batch": 1,
                         "train.ema_enable": False, "validation.enable": False}
            config = sft_config("sana-image-sft", pipeline, folder, image_folder(folder / "data"), **overrides)
        config.custom.setdefault("model", {})["fsdp_gradient_sync"] = sync
        trainer = build_trainer(config)
        start = lora(trainer)
        record(trainer)
        for step in range(2):  # two samples a rank: two backwards a step
            trainer.step_training(batch[2 * rank : 2 * rank + 2], total_steps=2, train_step=step, save_freq=10)
        return {"start": start, "end": lora(trainer), "per_opt": per_optimizer_step(),
                "groups": trained_groups(trainer.model.transformer)}

    results = {f"nft-{sync}": nft(sync) for sync in ("every_backward", "auto")}
    fixed_noise_sft()
    results.update({f"sft-{sync}": sft(sync) for sync in ("every_backward", "auto")})
    results["sft-full-auto"] = sft("auto", full=True)
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> list[dict]:
    out = tmp_path_factory.mktemp("gradient_sync")
    run_two_ranks(WORKER, tiny_image_pipeline_dir, out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def assert_same_training(deferred: dict, every: dict) -> None:
    assert deferred["end"].keys() == every["end"].keys()
    moved = [k for k in every["end"] if not torch.equal(every["start"][k], every["end"][k])]
    assert any(".default." in k for k in moved)
    for key in deferred["end"]:
        torch.testing.assert_close(deferred["start"][key], every["start"][key], rtol=0, atol=0, msg=key)
        torch.testing.assert_close(deferred["end"][key], every["end"][key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_nft_reduce_scatters_once_per_optimizer_step_and_trains_the_same(ranks: list[dict]) -> None:
    """The tiny NFT recipe: 8 samples a rank; optimizer batches of 4 in mini-batches of 2, each sample
    trained on K = int(4 · 0.6) = 2 timesteps: 2 optimizer steps a training step, 2 · 2 = 4 backwards each."""
    for rank in ranks:
        every, deferred = rank["nft-every_backward"], rank["nft-auto"]
        groups = every["groups"]  # LoRA targets attention only: the 2 transformer blocks
        assert groups == 2 and deferred["groups"] == groups
        assert every["per_opt"] == [(4, 4 * groups)] * 4  # 2 steps × 2 optimizer steps
        assert deferred["per_opt"] == [(4, groups)] * 4
        assert_same_training(deferred, every)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_sft_reduce_scatters_once_per_optimizer_step_and_trains_the_same(ranks: list[dict]) -> None:
    for rank in ranks:
        every, deferred = rank["sft-every_backward"], rank["sft-auto"]
        groups = every["groups"]
        assert groups == 2
        assert every["per_opt"] == [(2, 2 * groups)] * 2  # 2 steps of 2 one-sample micro-batches a rank
        assert deferred["per_opt"] == [(2, groups)] * 2
        assert_same_training(deferred, every)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_single_thread")
def test_full_parameter_training_reduce_scatters_every_backward_by_default(ranks: list[dict]) -> None:
    for rank in ranks:
        full = rank["sft-full-auto"]
        assert full["groups"] == 4  # every sharded module trains: the 2 blocks, patch_embed and the root
        assert full["per_opt"] == [(2, 2 * full["groups"])] * 2


def test_unknown_gradient_sync_is_named() -> None:
    from cosmos_sana.plugin_manager import load_plugins
    from cosmos_sana.validation import ConfigInvalid, validate_file

    recipe_file = Path(__file__).resolve().parents[1] / "toml" / "tiny" / "sana-image-nft.toml"
    with pytest.raises(ConfigInvalid, match=r"custom.model.fsdp_gradient_sync") as info:
        validate_file(recipe_file, ['custom.model.fsdp_gradient_sync="sometimes"'], registry=load_plugins())
    assert "last_backward" in str(info.value)
    validate_file(recipe_file, ['custom.model.fsdp_gradient_sync="every_backward"'], registry=load_plugins())
