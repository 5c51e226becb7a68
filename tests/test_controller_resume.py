"""cosmos-rl's controller continues its step count and prompt stream from cosmos-sana checkpoints."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from fixtures_trainers import build_trainer, recipe

from cosmos_sana.checkpoint import CheckpointError, checkpoint_dir
from cosmos_sana.checkpoint.controller_resume import SanaControllerResume, controller_resume_kwargs, stream_position
from cosmos_sana.compat import cosmos_rl as compat

PROMPTS = ["a red cube", "a blue sky", "a green field"]
PER_STEP = 2  # train_batch_per_replica 8 / n_generation 4: step 2 ends one prompt into epoch 2
STEPS = 2
REMAIN = len(PROMPTS) * 4 * 1000 - STEPS * 8  # completions: 3 prompts × 4 × 1000 epochs, 8 a step


@pytest.fixture(scope="module")
def first_run(tiny_image_pipeline_dir, tmp_path_factory, cosmos_registries):
    """Run ``run1`` trains two local NFT steps on a 3-prompt file and checkpoints step 2 with the
    real trainer; a half-written step-5 checkpoint sits beside it."""
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    root = tmp_path_factory.mktemp("runs")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")

    def config_for(run: str, resume: bool | str = False, **overrides):
        return recipe("sana-image-nft", tiny_image_pipeline_dir, root / run, {
            "train.timestamp": run, "train.resume": resume, "custom.data.args.path": str(prompts), **overrides,
        })

    config = config_for("run1")
    components = build_components(config)
    run_local(config, STEPS, components)
    trainer = components[0]
    trainer.save_checkpoint(current_step=STEPS, total_steps=40, remain_samples_num=REMAIN, is_final=False)
    saved = checkpoint_dir(root / "run1", STEPS)
    half = checkpoint_dir(root / "run1", 5)
    shutil.copytree(saved, half)
    (half / "COMPLETE").unlink()
    return SimpleNamespace(config_for=config_for, trainer=trainer, saved=saved, half=half)


def fetcher(config, **kwargs):
    """cosmos-rl's controller-side prompt fetcher, built as its controller builds it."""
    from cosmos_rl.dispatcher.data.data_fetcher import ControllerDataFetcher

    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory

    return ControllerDataFetcher(config=config, dataset=dataset_factory(installed_plugins(), "data"), **kwargs)


def prompt_stream(data_fetcher, steps: int) -> list[list[int]]:
    """Prompt indices handed out per step (the colocated rollout asks for rollout.batch_size = 2)."""
    return [[p.prompt_idx for p in data_fetcher.get_batched_prompt(PER_STEP)[0]] for _ in range(steps)]


def adapter_for(config) -> SanaControllerResume:
    adapter = controller_resume_kwargs(config)["resume_adapter"]
    adapter.make_sampler(len(PROMPTS))
    return adapter


def test_load_metadata_takes_the_latest_complete_checkpoint_of_any_run(first_run):
    config = first_run.config_for("run2", resume=True)
    metadata = adapter_for(config).load_metadata(config)
    assert metadata.checkpoint_path == str(first_run.saved.absolute())  # iter_000000005 has no COMPLETE
    assert metadata.checkpoint_id == "iter_000000002"
    assert (metadata.completed_training_steps, metadata.remaining_completions) == (STEPS, REMAIN)
    assert metadata.completed_optimizer_updates == first_run.trainer.optimizer_updates > 0
    assert metadata.epoch == 2 and metadata.sampling_owner == "sampler"
    assert metadata.sampler_state == {"seed": 0, "epoch": 2, "position": 1}  # 4 prompts of 3 consumed


def test_load_metadata_explicit_paths(first_run, tmp_path):
    config = first_run.config_for("run2", resume=str(first_run.saved))
    assert adapter_for(config).load_metadata(config).completed_training_steps == STEPS
    config = first_run.config_for("run2", resume=str(first_run.half))
    with pytest.raises(CheckpointError, match=str(first_run.half)):
        adapter_for(config).load_metadata(config)
    fresh = recipe("sana-image-nft", tmp_path / "pipe", tmp_path / "out" / "run", {"train.resume": True})
    assert adapter_for(fresh).load_metadata(fresh) is None
    with pytest.raises(RuntimeError, match="make_sampler"):
        controller_resume_kwargs(fresh)["resume_adapter"].load_metadata(fresh)


def test_trainer_resumes_across_run_folders_and_agrees_with_the_controller(first_run):
    from cosmos_rl.utils.resume import validate_resume_metadata

    config = first_run.config_for("run2", resume=True)
    metadata = adapter_for(config).load_metadata(config)
    trainer = build_trainer(config)  # writes to run2, resumes from run1
    info = trainer.weight_resume()
    validate_resume_metadata(metadata.to_checkpoint_extra_info(), info)  # the controller's exact check
    assert trainer.consumed_prompts == STEPS * PER_STEP


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 4, 7])
def test_restore_sampler_continues_where_an_uninterrupted_stream_is(consumed):
    def stream(sampler, epoch: int, count: int) -> list[int]:
        out = []  # as the controller: set_epoch(e), iterate, next epoch on exhaustion
        while len(out) < count:
            sampler.set_epoch(epoch)
            out += list(sampler)[: count - len(out)]
            epoch += 1
        return out

    adapter = SanaControllerResume(seed=7)
    uninterrupted = stream(adapter.make_sampler(len(PROMPTS)), 1, consumed + 8)
    epoch, position = stream_position(consumed, len(PROMPTS))
    resumed = adapter.make_sampler(len(PROMPTS))
    resumed.set_epoch(epoch)  # the fetcher sets the metadata's epoch, then restores
    adapter.restore_sampler(resumed, SimpleNamespace(sampler_state={"seed": 7, "epoch": epoch, "position": position}))
    continued = list(resumed)
    continued += stream(resumed, epoch + 1, 8 - len(continued))
    assert continued == uninterrupted[consumed:]


def test_restore_sampler_refuses_a_foreign_sampler_or_seed():
    from torch.utils.data import DistributedSampler

    adapter = SanaControllerResume(seed=0)
    state = SimpleNamespace(sampler_state={"seed": 1, "epoch": 1, "position": 0})
    with pytest.raises(TypeError, match="DistributedSampler"):
        adapter.restore_sampler(DistributedSampler(range(3), num_replicas=1, rank=0), state)
    with pytest.raises(ValueError, match="seed 1"):
        adapter.restore_sampler(adapter.make_sampler(3), state)


def test_our_sampler_keeps_cosmos_rl_default_order(first_run):
    config = first_run.config_for("run2")
    assert prompt_stream(fetcher(config), 6) == prompt_stream(fetcher(config, **controller_resume_kwargs(config)), 6)


def test_cosmos_rl_data_fetcher_resumes_the_prompt_stream(first_run):
    plain = first_run.config_for("run2")
    uninterrupted = prompt_stream(fetcher(plain, **controller_resume_kwargs(plain)), STEPS + 4)
    config = first_run.config_for("run2", resume=True)
    resumed = fetcher(config, **controller_resume_kwargs(config))
    assert resumed.epoch == 2 and resumed.remain_samples_num == REMAIN
    assert resumed.ckpt_extra_info["step"] == STEPS  # the controller's step count continues from here
    assert config.train.resume == str(first_run.saved.absolute())  # what the workers are told to load
    assert prompt_stream(resumed, 4) == uninterrupted[STEPS:]


def test_colocated_local_fetcher_needs_and_gets_the_adapter(first_run):
    """The policy process's own fetcher sees the controller-published checkpoint path."""
    import cosmos_rl.colocated.controller as colocated
    from cosmos_rl.utils.resume import NoCheckpointFound

    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory

    config = first_run.config_for("run2", resume=str(first_run.saved.absolute()))
    with pytest.raises(NoCheckpointFound):  # upstream as is: looks for a cosmos-rl checkpoint there
        fetcher(config.model_copy(deep=True))
    local = colocated.ControllerDataFetcher(  # as ColocatedController.setup calls it, after register_all
        config=config, dataset=dataset_factory(installed_plugins(), "data"), sampler=None, is_rl=True
    )
    assert local.epoch == 2 and local.ckpt_extra_info["step"] == STEPS


def test_bridge_gives_the_controller_the_adapter_for_rl_only(first_run, tiny_image_pipeline_dir, tmp_path):
    from cosmos_sana.bridge import controller_kwargs
    from cosmos_sana.plugin_manager import installed_plugins

    registry = installed_plugins()
    kwargs = controller_kwargs(registry, first_run.config_for("run2"))
    assert set(kwargs) <= set(compat.CONTROLLER_KWARGS)
    assert isinstance(kwargs["resume_adapter"], SanaControllerResume)
    assert kwargs["sampler"] == kwargs["resume_adapter"].make_sampler
    sft = recipe("sana-image-sft", tiny_image_pipeline_dir, tmp_path)
    assert not {"sampler", "resume_adapter"} & set(controller_kwargs(registry, sft))
