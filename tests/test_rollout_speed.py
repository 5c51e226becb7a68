"""``[custom.rollout.speed]``: the ``sana`` rollout samples the same with the speed features on."""

from __future__ import annotations

import pytest
import torch
from fixtures_trainers import build_rollout, build_trainer, payloads, recipe
from pydantic import ValidationError

from cosmos_sana.config.rollout import SpeedOptions
from cosmos_sana_plugins.sana.fast_attention import Bf16LinearAttnProcessor

pytestmark = pytest.mark.usefixtures("torch_single_thread")

PROMPTS = ["a red cube", "a blue sky"]
#: every feature that runs on CPU; "eager" compiles without a C++ toolchain
CPU_SPEED = {"linear_attention": "bf16", "cache_text_kv": True, "compile_blocks": True, "compile_backend": "eager",
             "vae_channels_last": True}


def _trainer(pipeline, tmp_path, overrides):
    config = recipe("sana-image-nft", pipeline, tmp_path, {"rollout.n_generation": 2, **overrides})
    trainer = build_trainer(config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # the same trainable weights in every trainer, and old ≠ current
        for p in trainer.model.transformer.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return config, trainer


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_speed_features_sample_like_plain_rollouts(tiny_image_pipeline_dir, tmp_path, cosmos_registries, lora):
    overrides = {} if lora else {"policy.lora": None}
    plain_config, plain = _trainer(tiny_image_pipeline_dir, tmp_path / "plain", overrides)
    fast_config, fast = _trainer(tiny_image_pipeline_dir, tmp_path / "fast",
                                 {**overrides, "custom.rollout.speed": CPU_SPEED})
    plain_rollout, fast_rollout = build_rollout(plain_config, plain.model), build_rollout(fast_config, fast.model)
    blocks = fast.model.transformer.transformer_blocks
    assert all(isinstance(b.attn1.processor, Bf16LinearAttnProcessor) and b._compiled_call_impl for b in blocks)
    if not lora:  # the full-parameter old copy NFT samples with is accelerated too
        assert all(b._compiled_call_impl for b in fast.policies.old.transformer_blocks)
    for _ in range(2):  # the second round after an in-place blend of the old policy
        want = plain_rollout.rollout_generation(payloads(PROMPTS), None, None, None)
        got = fast_rollout.rollout_generation(payloads(PROMPTS), None, None, None)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.completions, b.completions, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.extra_info["x0"], b.extra_info["x0"], rtol=1e-5, atol=1e-5)
        for trainer in (plain, fast):
            trainer.policies.update_old(decay=0.5)


def test_cuda_graphs_are_refused_on_cpu(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config, trainer = _trainer(tiny_image_pipeline_dir, tmp_path, {"custom.rollout.speed": {"cuda_graph_max_batch": 2}})
    with pytest.raises(ValueError, match=r"custom\.rollout\.speed\.cuda_graph_max_batch = 2 needs a CUDA GPU"):
        build_rollout(config, trainer.model)
    assert not trainer.model.transformer.transformer_blocks[0]._compiled_call_impl  # nothing installed


def test_speed_settings_are_strict_and_off_by_default():
    assert not SpeedOptions().enabled and not SpeedOptions(compile_backend="eager").enabled
    assert SpeedOptions(cache_text_kv=True).enabled
    with pytest.raises(ValidationError):
        SpeedOptions(cuda_graphs=True)
    with pytest.raises(ValidationError):
        SpeedOptions(cuda_graph_max_batch=-1)
