"""The typed link between an RL trainer and the colocated rollout that samples its model
(:mod:`cosmos_sana_plugins.trainers.rollout_link`), on the tiny SANA."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from fixtures_trainers import build_rollout, build_trainer, payloads, recipe

from cosmos_sana.seeds import derive_seed
from cosmos_sana_plugins.sana import lora as lora_utils
from cosmos_sana_plugins.sana.sampling import generators_for, sample, sampler_settings
from cosmos_sana_plugins.trainers.rollout_link import TrainerLink, attach, link_of

pytestmark = pytest.mark.usefixtures("torch_single_thread")

PROMPT = "a red cube"
SMALL = {"rollout.n_generation": 2, "policy.diffusers.sample.num_steps": 2, "custom.reward_runtime": {"mode": "sync"}}


def nft_config(pipeline, tmp_path, **overrides):
    return recipe("sana-image-nft", pipeline, tmp_path, {**SMALL, **overrides})


def move_default_adapter(model) -> None:
    """Make the trained adapter differ from ``old``, so which one sampled is visible."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in lora_utils.adapter_parameters(model.transformer, "default").values():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def resample(model, result, config, adapter: str | None):
    """``result``'s samples again from their seeds, with ``adapter`` active (None: the model as it is)."""
    text = model.encode_text([PROMPT]).repeat_interleave(len(result.extra_info["seeds"]))
    generators = generators_for(result.extra_info["seeds"].tolist(), "cpu")
    settings = sampler_settings(config, model)
    if adapter is None:
        return sample(model, text, generators, settings).media
    with model.adapter(adapter):
        return sample(model, text, generators, settings).media


def test_the_rollout_samples_through_the_link_its_trainer_attached(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = nft_config(tiny_image_pipeline_dir, tmp_path)
    trainer = build_trainer(config)
    model = trainer.model
    link = link_of(model)
    assert isinstance(link, TrainerLink) and link.policies is trainer.policies
    assert "rl_policies" not in vars(model) and not hasattr(model, "rl_policies")
    move_default_adapter(model)
    trainer.policies.completed_steps = 5  # what a finished step (or a resume) sets
    (result,) = build_rollout(config, model).rollout_generation(
        payloads([PROMPT]), None, None, None, current_weight_version=2
    )
    # seeded from the trainer's count, not cosmos-rl's weight version; sampled with NFT's old policy
    assert result.extra_info["seeds"].tolist() == [derive_seed(config.train.seed, "rollout", 0, 5, k) for k in range(2)]
    torch.testing.assert_close(result.completions, resample(model, result, config, "old"), rtol=0, atol=1e-6)
    assert not torch.allclose(result.completions, resample(model, result, config, None), atol=1e-4)


def test_a_rollout_without_a_trainer_samples_the_current_weights(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    from cosmos_rl.policy.model import ModelRegistry

    config = nft_config(tiny_image_pipeline_dir, tmp_path)
    model = ModelRegistry.build_model(config)  # a standalone rollout worker's model: no trainer
    assert link_of(model) is None
    move_default_adapter(model)
    (result,) = build_rollout(config, model).rollout_generation(
        payloads([PROMPT]), None, None, None, current_weight_version=2
    )
    assert result.extra_info["seeds"].tolist() == [derive_seed(config.train.seed, "rollout", 0, 2, k) for k in range(2)]
    torch.testing.assert_close(result.completions, resample(model, result, config, None), rtol=0, atol=1e-6)
    assert not torch.allclose(result.completions, resample(model, result, config, "old"), atol=1e-4)


def test_the_link_lives_as_long_as_its_model(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    """A full-parameter NFT trainer with EMA: the link outlives the trainer while its model lives
    (the rollout keeps sampling the old copy), and goes, old copy and all, with the model."""
    config = nft_config(tiny_image_pipeline_dir, tmp_path, **{"policy.lora": None, "train.ema_enable": True})
    trainer = build_trainer(config)
    model, link = trainer.model, link_of(trainer.model)
    trainer.policies.completed_steps = 3
    rollout = build_rollout(config, model)
    rollout.rollout_generation(payloads([PROMPT]), None, None, None)
    trainer_ref, link_ref, old_ref = weakref.ref(trainer), weakref.ref(link), weakref.ref(link.old)
    del trainer, link
    gc.collect()
    assert trainer_ref() is None, "the link must not keep the trainer alive"
    assert link_of(model) is link_ref() and link_of(model).completed_steps == 3
    with link_of(model).evaluation_view() as view:  # still served once the trainer and its EMA are gone
        assert view is model
    model_ref = weakref.ref(model)
    del model, rollout, view
    gc.collect()
    assert model_ref() is None and link_ref() is None and old_ref() is None


def test_one_link_per_model_and_only_to_its_own_model(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    from cosmos_rl.policy.model import ModelRegistry

    config = nft_config(tiny_image_pipeline_dir, tmp_path)
    trainer = build_trainer(config)
    attach(trainer.model, link_of(trainer.model))  # attaching the same link again changes nothing
    with pytest.raises(ValueError, match="already has a trainer link"):
        attach(trainer.model, TrainerLink(trainer.policies))
    with pytest.raises(ValueError, match="the model its policies belong to"):
        attach(ModelRegistry.build_model(config), TrainerLink(trainer.policies))
