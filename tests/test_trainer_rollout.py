"""The ``sana`` rollout backend and best-of-n on the tiny SANA."""

from __future__ import annotations

import pytest
import torch
from fixtures_trainers import build_rollout, build_trainer, payloads, recipe

from cosmos_sana.config.best_of_n import BestOfNOptions
from cosmos_sana_plugins.sana import lora as lora_utils
from cosmos_sana_plugins.sana.sampling import generators_for, sample, sampler_settings
from cosmos_sana_plugins.rollout import best_of_n
from cosmos_sana_plugins.rollout.best_of_n import BestOfNSampler, MergedTransformer, check_preview_support

PROMPTS = ["a red cube", "a blue sky", "a cat"]


@pytest.fixture(scope="module")
def nft(tiny_image_pipeline_dir, tmp_path_factory, cosmos_registries):
    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path_factory.mktemp("rollout"),
                    {"rollout.n_generation": 2})
    trainer = build_trainer(config)
    with torch.no_grad():  # make old and default differ, so which one sampled is visible
        for p in lora_utils.adapter_parameters(trainer.model.transformer, "default").values():
            p.copy_(torch.randn_like(p) * 0.1)
    return config, trainer


def test_groups_are_prompt_major_and_reproducible_from_seeds(nft):
    from cosmos_rl.utils.payload import extract_rollouts

    config, trainer = nft
    model = trainer.model
    results = build_rollout(config, model).rollout_generation(payloads(PROMPTS), None, None, None)
    assert len(results) == 3
    settings = sampler_settings(config, model)
    for prompt, result in zip(PROMPTS, results):
        assert result.completion_trainable == [True, True]
        info = result.extra_info
        own = model.encode_text([prompt])
        assert torch.equal(info["text_embeds"], own.embeds.expand(2, -1, -1))  # rows [i·n, (i+1)·n)
        # NFT rollouts sample with the old adapter; each sample is its seed's
        with model.adapter("old"):
            again = sample(model, own.repeat_interleave(2), generators_for(info["seeds"].tolist(), "cpu"), settings)
        torch.testing.assert_close(result.completions, again.media, rtol=0, atol=1e-6)
        torch.testing.assert_close(info["x0"], again.latents, rtol=0, atol=1e-6)
    # cosmos-rl splits extra_info per completion on the way to the trainer
    payload = payloads(PROMPTS[:1])[0]
    payload.completions, payload.extra_info = results[0].completions, results[0].extra_info
    payload.rewards, payload.advantages, payload.filter_rewards = [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]
    first, second = extract_rollouts([payload], False)[0]
    assert first.extra_info["x0"].shape == results[0].extra_info["x0"].shape[1:]
    assert first.extra_info["seeds"] != second.extra_info["seeds"]


def test_only_training_rollouts_count_in_the_step_clock(nft):
    from cosmos_sana.step_clock import STEP_CLOCK

    config, trainer = nft
    rollout = build_rollout(config, trainer.model)
    STEP_CLOCK.close_step()
    rollout.rollout_generation(payloads(PROMPTS[:1]), None, None, None, is_validation=True)
    assert STEP_CLOCK.close_step()["time/rollout_s"] == 0.0
    rollout.rollout_generation(payloads(PROMPTS[:1]), None, None, None)
    assert STEP_CLOCK.close_step()["time/rollout_s"] > 0.0


def test_best_of_n_keeps_best_and_worst_drafts_and_regenerates_them(nft):
    config, trainer = nft
    model = trainer.model
    options = BestOfNOptions(num_drafts=4, preview_steps=2)
    scored = []

    def score(media, prompts, metadata):
        values = media.flatten(1).mean(1).tolist()
        scored.append(values)
        return values

    sampler = BestOfNSampler(options, n_generation=2, score=score)
    assert sampler.chunk == 4  # largest divisor of 4 drafts ≤ 24
    settings = sampler_settings(config, model)
    seeds = iter(range(100, 200))
    text = model.encode_text(PROMPTS[:2])
    out, kept, scores = sampler.generate(model, model, text, PROMPTS[:2], [{}, {}], settings,
                                         lambda k: [next(seeds) for _ in range(k)])
    assert scores.shape == (2, 4)
    for i in range(2):
        drafts = list(range(100 + 4 * i, 104 + 4 * i))
        best, worst = int(scores[i].argmax()), int(scores[i].argmin())
        assert kept[2 * i : 2 * i + 2] == [drafts[best], drafts[worst]]
    again = sample(model, text.repeat_interleave(2), generators_for(kept, "cpu"), settings)  # full quality
    torch.testing.assert_close(out.media, again.media, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="n_generation = 5"):
        BestOfNSampler(options, n_generation=5, score=score)


def test_merged_compiled_copy_matches_peft_and_follows_the_old_adapter(nft, monkeypatch):
    config, trainer = nft
    model = trainer.model
    monkeypatch.setattr(best_of_n.torch, "compile", lambda module: module)  # no C++ toolchain needed
    merged = MergedTransformer("compile", lambda: (model.transformer, "old"), lambda: trainer.policies.version)
    latents, sigma = torch.randn(2, 4, 16, 16), torch.tensor([0.7, 0.3])
    text = model.encode_text(PROMPTS[:2])

    def check():
        view = best_of_n.transformer_for("compile", model, merged)
        with torch.no_grad(), model.adapter("old"):
            torch.testing.assert_close(view.velocity(latents, sigma, text), model.velocity(latents, sigma, text),
                                       rtol=1e-4, atol=1e-5)

    check()
    first = merged.module
    trainer.policies.update_old(decay=0.0)  # old ← default: the copy must follow, in place
    check()
    assert merged.module is first


@pytest.mark.parametrize("kind", ["fp8", "nvfp4"])
def test_low_precision_previews_are_refused_on_cpu(kind):
    with pytest.raises(ValueError, match=f"custom.rollout.best_of_n.preview_model = '{kind}' needs a CUDA GPU"):
        check_preview_support(kind, torch.device("cpu"))
    check_preview_support("compile", torch.device("cpu"))


def test_backend_best_of_n_from_config_with_compiled_preview(tiny_image_pipeline_dir, tmp_path, cosmos_registries,
                                                             monkeypatch):
    monkeypatch.setattr(best_of_n.torch, "compile", lambda module: module)
    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path, {
        "rollout.n_generation": 2,
        "custom.rollout.best_of_n": {"num_drafts": 4, "preview_steps": 2, "preview_model": "compile"},
    })
    trainer = build_trainer(config)
    rollout = build_rollout(config, trainer.model)
    (result,) = rollout.rollout_generation(payloads(["a red cube"]), None, None, None)
    assert result.completions.shape[0] == 2 and result.completion_trainable == [True, True]
    assert rollout._merged["compile"].module is not None  # drafts ran on the merged copy
    # the kept seeds regenerate at full quality with the old policy
    seeds = result.extra_info["seeds"].tolist()
    text = trainer.model.encode_text(["a red cube"]).repeat_interleave(2)
    with trainer.model.adapter("old"):
        again = sample(trainer.model, text, generators_for(seeds, "cpu"), sampler_settings(config, trainer.model))
    torch.testing.assert_close(result.completions, again.media, rtol=0, atol=1e-6)
