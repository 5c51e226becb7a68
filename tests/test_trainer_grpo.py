"""Flow-GRPO and DDRL through cosmos-rl's registered trainer classes on the tiny SANA."""

from __future__ import annotations

import pytest
import torch
from fixtures_trainers import brightness, build_rollout, build_trainer, recipe, scored_rollouts
from PIL import Image

from cosmos_sana_plugins.sana import lora as lora_utils
from cosmos_sana_plugins.trainers import losses
from cosmos_sana_plugins.trainers.rl import RolloutBatch

PROMPTS = ["a red cube", "a blue sky"]
ONE_STEP = {"policy.diffusers.timesteps_fraction": 1.0, "train.train_policy.mini_batch": 8, "train.optm_lr": 1e-4,
            "train.train_policy.epsilon_low": 0.2, "train.train_policy.epsilon_high": 0.2}
WITH_KL = {**ONE_STEP, "train.train_policy.kl_beta": 0.04}


def advantages(trainer, batch):
    tp = trainer.config.train.train_policy
    adv = losses.group_advantages(batch.rewards, batch.group_ids, global_std=False)
    return adv.clamp(tp.advantage_low, tp.advantage_high)


@torch.no_grad()
def fixed_loss(trainer, batch, adv) -> float:
    index = torch.arange(batch.size)
    values = [trainer.loss_terms(batch, index, torch.full((batch.size,), j), adv)["loss"] for j in range(batch.num_steps)]
    return torch.stack(values).mean().item()


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_first_inner_step_ratio_is_one_for_every_sample_and_step(guidance, tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path,
                    {"policy.diffusers.sample.guidance_scale": guidance, "rollout.n_generation": 3})
    trainer = build_trainer(config)
    with torch.no_grad():  # a non-trivial LoRA, so the policy differs from the reference
        for p in lora_utils.adapter_parameters(trainer.model.transformer, "default").values():
            p.copy_(torch.randn_like(p) * 0.05)
    batch = RolloutBatch.collate(scored_rollouts(build_rollout(config, trainer.model), PROMPTS, brightness), trainer.device)
    assert batch.trajectory.shape[:2] == (6, 5) and batch.log_probs.shape == (6, 4)
    index = torch.arange(batch.size)
    with torch.no_grad():
        for j in range(batch.num_steps):
            log_prob, _, _ = trainer.step_log_prob(batch, index, torch.full((batch.size,), j))
            ratio = torch.exp(log_prob.double() - batch.log_probs[:, j].double())
            torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def grpo(tiny_image_pipeline_dir, tmp_path_factory, cosmos_registries):
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path_factory.mktemp("grpo"), WITH_KL)
    trainer = build_trainer(config)
    return trainer, build_rollout(config, trainer.model)


def test_grpo_step_changes_only_the_adapter_and_lowers_loss(grpo):
    trainer, rollout = grpo
    model = trainer.model
    rollouts = scored_rollouts(rollout, PROMPTS, brightness)
    batch = RolloutBatch.collate(rollouts, trainer.device)
    adv = advantages(trainer, batch)
    lora0 = {k: v.detach().clone() for k, v in lora_utils.adapter_parameters(model.transformer, "default").items()}
    base0 = {n: p.detach().clone() for n, p in model.transformer.named_parameters() if "lora_" not in n}
    before = fixed_loss(trainer, batch, adv)
    # at ρ = 1 and zero KL the loss is −mean(A) (= 0: advantages are centred per prompt)
    assert before == pytest.approx(-adv.mean().item(), abs=1e-6)
    report = trainer.step_training(rollouts, current_step=1, total_steps=10)
    assert report["train/ratio"] == pytest.approx(1.0, abs=1e-5)  # the first inner step is on-policy
    assert report["train/kl_loss"] == pytest.approx(0.0, abs=1e-12)  # the LoRA starts at the base model
    after_lora = lora_utils.adapter_parameters(model.transformer, "default")
    assert any(not torch.equal(lora0[k], v) for k, v in after_lora.items())
    for name, value in model.transformer.named_parameters():
        if "lora_" not in name:
            assert torch.equal(value, base0[name])
    assert fixed_loss(trainer, batch, adv) < before


def test_ode_sampler_is_refused(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    from cosmos_sana_plugins.trainers.grpo import SanaFlowGRPOTrainer

    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, {"custom.rollout.sampler": "ode"})
    with pytest.raises(ValueError, match="custom.rollout.sampler = 'ode'"):
        SanaFlowGRPOTrainer.check_config(config)


# ---------------------------------------------------------------- DDRL


@pytest.fixture
def real_images(tmp_path):
    folder = tmp_path / "real"
    folder.mkdir()
    for i, colour in enumerate([(250, 250, 250), (200, 200, 200), (230, 230, 230), (255, 255, 255)]):
        Image.new("RGB", (40, 40), colour).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"a bright square {i}\n")
    return folder


def test_ddrl_adds_data_beta_times_flow_matching(tiny_image_pipeline_dir, tmp_path, real_images, cosmos_registries, monkeypatch):
    from cosmos_sana_plugins.trainers import ddrl

    config = recipe("sana-image-ddrl", tiny_image_pipeline_dir, tmp_path,
                    {**ONE_STEP, "custom.real_data.args": {"path": str(real_images)}, "custom.trainer.real_batch_size": 2})
    trainer = build_trainer(config)
    rollouts = scored_rollouts(build_rollout(config, trainer.model), PROMPTS, brightness)
    batch = RolloutBatch.collate(rollouts, trainer.device)
    adv, index, step = advantages(trainer, batch), torch.arange(batch.size), torch.zeros(batch.size, dtype=torch.long)
    seen = []

    def fake_data_loss(model, latents, text):
        seen.append((latents.shape, text.embeds.shape[0]))
        return torch.tensor([2.0, 4.0])

    with monkeypatch.context() as patch:
        patch.setattr(ddrl, "flow_matching_per_sample", fake_data_loss)
        terms = trainer.loss_terms(batch, index, step, adv)
    # policy + data_beta · mean([2, 4]) = policy + 0.01 · 3, no KL term
    assert seen == [(torch.Size([2, 4, 16, 16]), 2)]
    assert "kl_loss" not in terms
    assert terms["loss"].item() == pytest.approx(terms["policy_loss"].item() + 0.01 * 3.0, abs=1e-6)

    lora0 = {k: v.detach().clone() for k, v in lora_utils.adapter_parameters(trainer.model.transformer, "default").items()}
    report = trainer.step_training(rollouts, current_step=1, total_steps=10)
    assert report["train/data_loss"] > 0
    after = lora_utils.adapter_parameters(trainer.model.transformer, "default")
    assert any(not torch.equal(lora0[k], v) for k, v in after.items())


def test_ddrl_refuses_kl_and_missing_real_data(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    from cosmos_sana_plugins.trainers.ddrl import SanaDDRLTrainer

    with pytest.raises(ValueError, match="kl_beta = 0.04: DDRL replaces the KL penalty"):
        SanaDDRLTrainer.check_config(recipe("sana-image-ddrl", tiny_image_pipeline_dir, tmp_path,
                                            {"train.train_policy.kl_beta": 0.04}))
    with pytest.raises(ValueError, match="custom.real_data"):
        SanaDDRLTrainer.check_config(recipe("sana-image-ddrl", tiny_image_pipeline_dir, tmp_path,
                                            {"custom.real_data": None}))
