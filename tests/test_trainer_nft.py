"""Diffusion-NFT through cosmos-rl's registered trainer class on the tiny SANA / SANA-Video."""

from __future__ import annotations

import pytest
import torch
from fixtures_trainers import brightness, build_rollout, build_trainer, recipe, scored_rollouts

from cosmos_sana_plugins.sana import lora as lora_utils
from cosmos_sana_plugins.trainers import losses
from cosmos_sana_plugins.trainers.rl import RolloutBatch

PROMPTS = ["a red cube", "a blue sky"]
# every grid step trained, one optimizer step per training step
ONE_STEP = {"policy.diffusers.timesteps_fraction": 1.0, "train.train_policy.mini_batch": 8}


def snapshot(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in params.items()}


def adapter(model, name):
    return lora_utils.adapter_parameters(model.transformer, name)


def base_params(model):
    return {n: p for n, p in model.transformer.named_parameters() if "lora_" not in n}


def advantages(trainer, batch):
    tp = trainer.config.train.train_policy
    adv = losses.group_advantages(batch.rewards, batch.group_ids, global_std=True)
    return adv.clamp(tp.advantage_low, tp.advantage_high)


@torch.no_grad()
def fixed_loss(trainer, batch, adv, draws: int = 8) -> float:
    """The NFT loss over every sample and grid step, averaged over ``draws`` fixed noise draws (the
    same draws before and after a step, so the comparison estimates the expected objective rather
    than the loss of one noise sample the step never saw)."""
    index = torch.arange(batch.size)
    values = []
    for draw in range(draws):
        torch.manual_seed(1234 + draw)
        values += [trainer.loss_terms(batch, index, torch.full((batch.size,), j), adv)["loss"] for j in range(batch.num_steps)]
    return torch.stack(values).mean().item()


@pytest.fixture(scope="module")
def lora_image(tiny_image_pipeline_dir, tmp_path_factory, cosmos_registries):
    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path_factory.mktemp("nft"),
                    {**ONE_STEP, "train.optm_lr": 1e-4, "train.ema_enable": True, "train.ema_decay": 0.9})
    trainer = build_trainer(config)
    return trainer, build_rollout(config, trainer.model)


def test_lora_step_updates_default_blends_old_and_lowers_loss(lora_image):
    trainer, rollout = lora_image
    model = trainer.model
    rollouts = scored_rollouts(rollout, PROMPTS, brightness)
    batch = RolloutBatch.collate(rollouts, trainer.device)
    adv = advantages(trainer, batch)
    default0, old0, base0 = snapshot(adapter(model, "default")), snapshot(adapter(model, "old")), snapshot(base_params(model))
    before = fixed_loss(trainer, batch, adv)

    report = trainer.step_training(rollouts, current_step=1, total_steps=10)

    default1, old1 = snapshot(adapter(model, "default")), snapshot(adapter(model, "old"))
    assert any(not torch.equal(default0[k], default1[k]) for k in default0)
    for name, value in base_params(model).items():
        assert torch.equal(value, base0[name]), f"frozen base weight {name} changed"
    decay = losses.weight_copy_decay(1, 1)  # 0.001
    for k in old1:  # old ← decay·old + (1 − decay)·default
        torch.testing.assert_close(old1[k], decay * old0[k] + (1 - decay) * default1[k], rtol=0, atol=1e-6)
    # the same objective (the pre-step old policy) on the same batch and noise is lower
    with torch.no_grad():
        for k, p in adapter(model, "old").items():
            p.copy_(old0[k])
    after = fixed_loss(trainer, batch, adv)
    with torch.no_grad():
        for k, p in adapter(model, "old").items():
            p.copy_(old1[k])
    assert after < before
    assert report["reward/mean"] == pytest.approx(sum(r.reward for r in rollouts) / len(rollouts), abs=1e-6)
    from cosmos_sana.compat.cosmos_rl import CONTROLLER_REPORT_KEYS

    assert CONTROLLER_REPORT_KEYS <= set(report)
    assert report["train/loss_max"] >= report["train/loss_avg"]
    assert {"train/loss", "train/policy_loss", "train/kl_loss", "reward/score/max", "optimizer/grad_norm"} <= report.keys()
    # one optimizer step: EMA shadow = 0.9·initial + 0.1·updated (FQN "….lora_A.default.weight")
    assert trainer.ema.shadow
    for fqn, shadow in trainer.ema.shadow.items():
        key = fqn.replace(".default.", ".")
        torch.testing.assert_close(shadow, 0.9 * default0[key] + 0.1 * default1[key], rtol=0, atol=1e-6)


def test_resume_restores_both_adapters_and_ema(lora_image, tmp_path):
    trainer, _ = lora_image
    trainer.save_checkpoint(current_step=1, total_steps=10, remain_samples_num=0, is_final=False)
    config = trainer.config.model_copy(deep=True)
    config.train.resume = True
    resumed = build_trainer(config)
    info = resumed.weight_resume()
    assert info["step"] == 1
    for name in ("default", "old"):
        for key, value in adapter(trainer.model, name).items():
            assert torch.equal(adapter(resumed.model, name)[key], value), (name, key)
    for key, value in trainer.ema.shadow.items():
        assert torch.equal(resumed.ema.shadow[key], value)
    # the export stock diffusers loads: the trained adapter with its EMA weights
    from diffusers import SanaPipeline

    folder = trainer.export_safetensors(str(tmp_path), "export")
    pipe = SanaPipeline.from_pretrained(trainer.config.policy.model_name_or_path)
    pipe.load_lora_weights(folder, weight_name="pytorch_lora_weights.safetensors")
    (loaded,) = pipe.transformer.peft_config  # diffusers names the adapter itself
    loaded_params = dict(pipe.transformer.named_parameters())
    scale = trainer.config.policy.lora.lora_alpha / trainer.config.policy.lora.r  # folded into lora_B by the export
    for fqn, shadow in trainer.ema.shadow.items():
        expected = shadow * scale if ".lora_B." in fqn else shadow
        torch.testing.assert_close(loaded_params[fqn.replace(".default.", f".{loaded}.")], expected)


def test_full_parameter_step_moves_transformer_and_old_copy(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path,
                    {**ONE_STEP, "policy.lora": None, "train.optm_lr": 1e-5, "policy.diffusers.weight_copy_decay_type": 2})
    trainer = build_trainer(config)
    assert not trainer.is_lora and trainer.policies.old is not None and trainer.policies.reference is not None
    rollouts = scored_rollouts(build_rollout(config, trainer.model), PROMPTS, brightness)
    batch = RolloutBatch.collate(rollouts, trainer.device)
    adv = advantages(trainer, batch)
    reference0 = snapshot(dict(trainer.policies.reference.named_parameters()))
    current0 = snapshot(dict(trainer.model.transformer.named_parameters()))
    before = fixed_loss(trainer, batch, adv)
    trainer.step_training(rollouts, current_step=1, total_steps=10)
    current1 = dict(trainer.model.transformer.named_parameters())
    assert any(not torch.equal(current0[k], current1[k]) for k in current0)
    # decay type 2 is 0 before step 75: old = current; the reference stays the base model
    for name, value in trainer.policies.old.named_parameters():
        torch.testing.assert_close(value, current1[name], rtol=0, atol=0)
    for name, value in trainer.policies.reference.named_parameters():
        assert torch.equal(value, reference0[name])
    with torch.no_grad():  # compare against the pre-step old policy
        torch._foreach_copy_(list(trainer.policies.old.parameters()), [current0[n] for n, _ in trainer.policies.old.named_parameters()])
    assert fixed_loss(trainer, batch, adv) < before


def test_video_lora_step(tiny_video_pipeline_dir, tmp_path, cosmos_registries):
    config = recipe("sana-video-nft", tiny_video_pipeline_dir, tmp_path, {**ONE_STEP, "train.train_policy.mini_batch": 4, "train.optm_lr": 1e-4})
    trainer = build_trainer(config)
    rollouts = scored_rollouts(build_rollout(config, trainer.model), PROMPTS, brightness)
    assert rollouts[0].completion.shape == (9, 3, 32, 32)
    batch = RolloutBatch.collate(rollouts, trainer.device)
    adv = advantages(trainer, batch)
    default0 = snapshot(adapter(trainer.model, "default"))
    old0 = snapshot(adapter(trainer.model, "old"))
    before = fixed_loss(trainer, batch, adv)
    trainer.step_training(rollouts, current_step=1, total_steps=10)
    assert any(not torch.equal(default0[k], v) for k, v in adapter(trainer.model, "default").items())
    with torch.no_grad():
        for k, p in adapter(trainer.model, "old").items():
            p.copy_(old0[k])
    assert fixed_loss(trainer, batch, adv) < before


def test_cfg_is_refused_with_the_key_named(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    from cosmos_sana_plugins.trainers.nft import SanaNFTTrainer

    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path, {"policy.diffusers.sample.guidance_scale": 4.5})
    with pytest.raises(ValueError, match=r"policy\.diffusers\.sample\.guidance_scale = 4\.5.*without classifier-free"):
        SanaNFTTrainer.check_config(config)
