"""The SANA adapter on tiny random pipelines: conditioning, masks, timesteps, seeds, video, LoRA, config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cosmos_sana.config import ModelOptions
from cosmos_sana_plugins.sana import lora as lora_utils
from cosmos_sana_plugins.sana import sampling

MAX_LEN = 16


def _diffusers_config(**overrides):
    from cosmos_rl.policy.config import DiffusersConfig

    return DiffusersConfig(**{"dtype": "float32", "offload": False, "max_prompt_length": MAX_LEN, **overrides})


def _lora(**overrides):
    from cosmos_rl.policy.config import LoraConfig

    kwargs = {"r": 4, "lora_alpha": 8.0, "lora_names": ["default", "old"], "init_lora_weights": "gaussian"}
    return LoraConfig(**{**kwargs, **overrides})


def _model(path, *, lora=None, chi="off", native=None, **config):
    from cosmos_sana_plugins.sana.model import SanaModel

    options = ModelOptions(complex_human_instruction=chi, device="cpu", native_checkpoint=native)
    return SanaModel(_diffusers_config(**config), lora_config=lora, model_str=str(path), options=options)


@pytest.fixture(scope="module")
def image_model(tiny_image_pipeline_dir):
    return _model(tiny_image_pipeline_dir, lora=_lora(), chi="image")


@pytest.fixture(scope="module")
def video_model(tiny_video_pipeline_dir):
    return _model(tiny_video_pipeline_dir, lora=_lora(), chi="video")


def _settings(model, **kw):
    frames = 5 if model.is_video else 1
    return sampling.SamplerSettings(height=64, width=64, frames=frames, num_steps=2, **kw)


def _capture_transformer_kwargs(model):
    seen = []
    handle = model.transformer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw), with_kwargs=True)
    return seen, handle


def _randomise(model, name):
    with torch.no_grad():
        for p in model.adapter_parameters(name):
            p.copy_(torch.randn_like(p) * 0.3)


def test_rollout_and_training_forwards_see_identical_text(image_model):
    prompts = ["a red cube", "a cat"]
    seen, handle = _capture_transformer_kwargs(image_model)
    try:
        sampling.sample(image_model, image_model.encode_text(prompts), sampling.generators_for([0, 1], "cpu"),
                        _settings(image_model, decode=False))
        rollout = seen[-1]
        image_model.training_sft_step(torch.rand(2, 3, 64, 64) * 2 - 1, prompts, timestep=torch.tensor([0.3, 0.6]))
        sft = seen[-1]
        embedding = image_model.text_embedding(prompts, max_sequence_length=MAX_LEN)  # what NFT packs
        image_model.transformer(**image_model.nft_prepare_transformer_input(
            latents=torch.randn(2, 4, 32, 32), prompt_embeds=embedding["encoder_hidden_states"],
            prompt_attention_mask=embedding["encoder_attention_mask"], pooled_prompt_embeds=None,
            timestep=torch.tensor([300.0, 600.0]), num_frames=1, height=64, width=64))
        nft = seen[-1]
    finally:
        handle.remove()
    for forward in (sft, nft):
        assert forward.get("attention_mask") is None
        torch.testing.assert_close(forward["encoder_hidden_states"], rollout["encoder_hidden_states"])
        assert torch.equal(forward["encoder_attention_mask"], rollout["encoder_attention_mask"])
    # the CHI prefix is in: a plain encoding of the same prompts differs
    assert rollout["encoder_attention_mask"].sum() > 0
    from cosmos_sana_plugins.sana.text import encode_prompts

    plain = encode_prompts(image_model.pipeline, prompts, chi="off", max_sequence_length=MAX_LEN)
    assert not torch.allclose(plain.embeds, rollout["encoder_hidden_states"])


def test_inference_runs_the_stock_pipeline_on_our_encoding(image_model):
    seen, handle = _capture_transformer_kwargs(image_model)
    try:
        images = image_model.inference(2, 64, 64, ["a red cube"], guidance_scale=2.0, output_type="pt")
    finally:
        handle.remove()
    assert images.shape == (1, 3, 64, 64) and len(seen) == 2
    text, negative = image_model.encode_text(["a red cube"]), image_model.negative_text(1)
    torch.testing.assert_close(seen[0]["encoder_hidden_states"], torch.cat([negative.embeds, text.embeds]))
    assert torch.equal(seen[0]["encoder_attention_mask"], torch.cat([negative.mask, text.mask]))


@pytest.mark.parametrize("which", ["image_model", "video_model"])
def test_mask_reaches_cross_attention(which, request):
    model = request.getfixturevalue(which)
    text = model.encode_text(["a cat"])
    padding = text.mask == 0
    assert padding.any()
    changed = text.embeds.clone()
    changed[padding] = 5.0
    x, sigma = torch.randn(1, *model.latent_shape(64, 64, 5)), torch.tensor([0.5])
    with torch.no_grad():
        base = model.velocity(x, sigma, text)
        masked = model.velocity(x, sigma, type(text)(changed, text.mask))
        unmasked = model.velocity(x, sigma, type(text)(changed, torch.ones_like(text.mask)))
    torch.testing.assert_close(masked, base)
    assert not torch.allclose(unmasked, base, atol=1e-4)


def test_image_timestep_scale_is_applied(image_model):
    transformer = image_model.transformer
    text = image_model.encode_text(["a cat"])
    x = torch.randn(1, 4, 32, 32)
    transformer.register_to_config(timestep_scale=2.0)
    try:
        with torch.no_grad():
            ours = image_model.velocity(x, torch.tensor([0.25]), text)
            # σ 0.25 → t = 0.25·1000·2.0 = 500
            direct = transformer(x, encoder_hidden_states=text.embeds, encoder_attention_mask=text.mask,
                                 timestep=torch.tensor([500.0]), return_dict=False)[0]
    finally:
        transformer.register_to_config(timestep_scale=1.0)
    torch.testing.assert_close(ours, direct)


def test_same_seed_same_image_whatever_the_batch(image_model):
    settings = _settings(image_model, sampler="sde", eta=0.7, guidance_scale=2.0, decode=False)
    text = image_model.encode_text(["a cat", "a dog", "a red cube"])
    batch = sampling.sample(image_model, text, sampling.generators_for([11, 12, 13], "cpu"), settings)
    again = sampling.sample(image_model, text, sampling.generators_for([11, 12, 13], "cpu"), settings)
    alone = sampling.sample(image_model, text.select([1]), sampling.generators_for([12], "cpu"), settings)
    assert torch.equal(batch.latents, again.latents)
    torch.testing.assert_close(alone.latents[0], batch.latents[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone.trajectory.log_probs[0], batch.trajectory.log_probs[1], atol=1e-5, rtol=1e-5)
    assert not torch.equal(batch.latents[0], batch.latents[1])


def test_video_rollout_has_the_configured_frames(video_model):
    text = video_model.encode_text(["a cat running"])
    out = sampling.sample(video_model, text, sampling.generators_for([3], "cpu"), _settings(video_model))
    assert out.media.shape == (1, 5, 3, 64, 64)  # B T C H W
    assert out.latents.shape == (1, 16, 2, 8, 8) and out.trajectory.latents.shape == (1, 3, 16, 2, 8, 8)
    with pytest.raises(ValueError, match="4·k \\+ 1"):
        video_model.latent_shape(64, 64, 6)
    assert video_model.encode_media(out.media).shape == out.latents.shape


@pytest.mark.parametrize("which", ["image_model", "video_model"])
def test_lora_training_step_only_updates_the_active_adapter(which, request):
    model = request.getfixturevalue(which)
    text = model.encode_text(["a cat"])
    shape = model.latent_shape(64, 64, 5 if model.is_video else 1)
    out = sampling.sample(model, text, sampling.generators_for([0], "cpu"), _settings(model, decode=False))
    model.transformer.zero_grad(set_to_none=True)
    model.velocity(out.latents, torch.tensor([0.4]), text).pow(2).mean().backward()
    grads = lora_utils.adapter_parameters(model.transformer, "default")
    assert all(p.grad is not None for p in grads.values())
    assert all(p.grad.abs().sum() > 0 for k, p in grads.items() if "lora_B" in k)  # A's grad is 0 while B = 0
    assert all(p.grad is None for p in model.adapter_parameters("old"))
    frozen = [p for n, p in model.transformer.named_parameters() if "lora_" not in n]
    assert frozen and all(p.grad is None and not p.requires_grad for p in frozen)
    assert {id(p) for p in model.trainable_params} == {id(p) for p in model.adapter_parameters("default")}
    assert out.latents.shape[1:] == shape
    model.transformer.zero_grad(set_to_none=True)


def test_adapters_switch_and_blend(tiny_image_pipeline_dir):
    model = _model(tiny_image_pipeline_dir, lora=_lora())
    x, sigma = torch.randn(1, 4, 32, 32), torch.tensor([0.5])
    text = model.encode_text(["a cat"])
    old = [p.detach().clone() for p in model.adapter_parameters("old")]
    _randomise(model, "default")
    with torch.no_grad():
        trained = model.velocity(x, sigma, text)
        with model.adapter("old"):
            before = model.velocity(x, sigma, text)
        with model.adapter(None):
            base = model.velocity(x, sigma, text)
    assert not torch.allclose(trained, before) and model.active_adapter == "default"
    # both adapters start as the same no-op gaussian init (B = 0): old == base before training
    torch.testing.assert_close(before, base)
    new = [p.detach().clone() for p in model.adapter_parameters("default")]
    model.blend_adapters("default", "old", decay=0.25)
    for got, o, n in zip(model.adapter_parameters("old"), old, new):
        torch.testing.assert_close(got, 0.25 * o + 0.75 * n)
    model.blend_adapters("default", "old", decay=0.0)
    with torch.no_grad(), model.adapter("old"):
        torch.testing.assert_close(model.velocity(x, sigma, text), trained)
    assert all(p.requires_grad for p in model.adapter_parameters("default"))
    assert not any(p.requires_grad for p in model.adapter_parameters("old"))


def test_diffusers_lora_file_round_trip(tiny_image_pipeline_dir, tmp_path):
    from diffusers import SanaPipeline

    from cosmos_sana_plugins.sana.lora import save_diffusers_lora

    source = _model(tiny_image_pipeline_dir, lora=_lora(lora_names=["default"]))
    _randomise(source, "default")
    weights = save_diffusers_lora(source.transformer, "default", tmp_path / "lora")
    assert weights.name == "pytorch_lora_weights.safetensors"
    x, sigma = torch.randn(1, 4, 32, 32), torch.tensor([0.5])
    text = source.encode_text(["a cat"])

    stock = SanaPipeline.from_pretrained(tiny_image_pipeline_dir)
    stock.load_lora_weights(str(tmp_path / "lora"), weight_name=weights.name)
    started = _model(tiny_image_pipeline_dir, lora=_lora(lora_path=str(weights)))
    with torch.no_grad():
        expected = stock.transformer(x, encoder_hidden_states=text.embeds, encoder_attention_mask=text.mask,
                                     timestep=torch.tensor([500.0]), return_dict=False)[0]
        assert not torch.allclose(expected, _model(tiny_image_pipeline_dir).velocity(x, sigma, text))
        for name in ("default", "old"):
            with started.adapter(name):
                torch.testing.assert_close(started.velocity(x, sigma, text), expected)

    # the same weights as a PEFT folder (adapter_config.json + base_model.model.* keys)
    from safetensors.torch import save_file

    from cosmos_sana_plugins.sana.lora import adapter_export

    peft_dir = tmp_path / "peft"
    source.transformer.peft_config["default"].save_pretrained(str(peft_dir))
    state, _ = adapter_export(source.transformer, "default")
    save_file({f"base_model.model.{k}": v for k, v in state.items()}, str(peft_dir / "adapter_model.safetensors"))
    from_peft = _model(tiny_image_pipeline_dir, lora=_lora(lora_names=["default"], lora_path=str(peft_dir)))
    with torch.no_grad():
        torch.testing.assert_close(from_peft.velocity(x, sigma, text), expected)

    with pytest.raises(ValueError, match="lora_alpha = 8.0, but \\[policy.lora\\] lora_alpha = 4"):
        _model(tiny_image_pipeline_dir, lora=_lora(lora_path=str(weights), lora_alpha=4.0))
    with pytest.raises(ValueError, match="target_modules"):
        _model(tiny_image_pipeline_dir, lora=_lora(lora_path=str(weights), target_modules=["to_q"]))


def test_full_parameter_training_and_frozen_encoders(tiny_image_pipeline_dir):
    model = _model(tiny_image_pipeline_dir, offload=True)
    assert model.lora_names == [] and len(model.trainable_params) == len(list(model.transformer.parameters()))
    assert not any(p.requires_grad for p in model.text_encoder.parameters())
    assert not any(p.requires_grad for p in model.vae.parameters())
    assert {id(m) for m in model.offloaded_models} == {id(model.text_encoder), id(model.vae)}
    with pytest.raises(ValueError, match="full-parameter"):
        model.use_adapter("old")
    out = sampling.sample(model, model.encode_text(["a cat"]), sampling.generators_for([0], "cpu"), _settings(model))
    assert out.media.shape == (1, 3, 64, 64) and 0 <= out.media.min() < out.media.max() <= 1


@pytest.mark.parametrize(("rslora", "scaling"), [(False, 8.0 / 4), (True, 8.0 / 4**0.5)])
def test_lora_hyperparameters_reach_peft(tiny_image_pipeline_dir, rslora, scaling):
    model = _model(tiny_image_pipeline_dir, lora=_lora(lora_names=["default"], use_rslora=rslora, lora_dropout=0.1,
                                                       target_modules=["to_q", "to_k"]))
    layers = dict(lora_utils._tuner_layers(model.transformer))
    assert sorted({name.rsplit(".", 1)[1] for name in layers}) == ["to_k", "to_q"]
    layer = layers["transformer_blocks.0.attn2.to_q"]
    assert layer.scaling["default"] == pytest.approx(scaling) and layer.r["default"] == 4
    assert layer.lora_dropout["default"].p == 0.1


def test_from_pretrained_reads_custom_model_and_sampler_settings(tiny_video_pipeline_dir):
    from cosmos_rl.policy.config import SampleConfig

    from cosmos_sana_plugins.sana.model import SanaModel

    diffusers_cfg = _diffusers_config(inference_size=[64, 64], train_frames=9, inference_frames=5,
                                      sample=SampleConfig(num_steps=3, eval_num_steps=4, noise_level=0.7,
                                                          guidance_scale=4.5))
    config = SimpleNamespace(
        policy=SimpleNamespace(diffusers=diffusers_cfg, lora=None),
        custom={"package": "cosmos-sana", "model": {"complex_human_instruction": "video", "device": "cpu",
                                                    "prompt_suffix": " motion score: 30."},
                "rollout": {"sampler": "cps", "sigma_schedule": "shifted"}},
    )
    model = SanaModel.from_pretrained(config, str(tiny_video_pipeline_dir))
    assert model.is_video and model.options.complex_human_instruction == "video"
    assert model.pipeline_call_kwargs()["complex_human_instruction"][0].startswith("Given a user prompt")
    rollout = sampling.sampler_settings(config, model)
    assert (rollout.frames, rollout.num_steps, rollout.sampler, rollout.eta, rollout.guidance_scale) == (
        9, 3, "cps", 0.7, 4.5)
    assert rollout.shift == 3.0  # the tiny scheduler's flow_shift
    validation = sampling.sampler_settings(config, model, validation=True)
    assert (validation.frames, validation.num_steps, validation.sampler) == (5, 4, "ode")
    diffusers_cfg.train_frames = 8
    with pytest.raises(ValueError, match="train_frames: video frames 8"):
        sampling.sampler_settings(config, model)
    config.policy.diffusers = _diffusers_config(lora=_lora())
    with pytest.raises(ValueError, match=r"\[policy.lora\]"):
        SanaModel.from_pretrained(config, str(tiny_video_pipeline_dir))


def test_training_sigmas_follow_the_configured_schedule(tiny_image_pipeline_dir):
    model = _model(tiny_image_pipeline_dir, weighting_scheme="logit_normal", logit_mean=0.0, logit_std=1.0,
                   train_flow_shift=3.0)
    sigmas = model.sample_training_sigmas(4, generator=torch.Generator().manual_seed(0))
    u = torch.sigmoid(torch.normal(0.0, 1.0, (4,), generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(sigmas, 3 * u / (1 + 2 * u))
    x0, noise = torch.randn(4, 4, 8, 8), torch.randn(4, 4, 8, 8)
    noisy, _, used = model.add_noise(x0, timestep=torch.tensor([0.0, 0.25, 0.5, 1.0]), noise=noise)
    torch.testing.assert_close(noisy[1], 0.75 * x0[1] + 0.25 * noise[1])
    torch.testing.assert_close(noisy[3], noise[3])
    assert used.tolist() == [0.0, 0.25, 0.5, 1.0]


def test_native_checkpoint_replaces_the_pipeline_transformer(tiny_image_pipeline_dir, tmp_path):
    from cosmos_sana_plugins.sana.native_checkpoint import save_native

    plain = _model(tiny_image_pipeline_dir)
    with torch.no_grad():
        for p in plain.transformer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    native = save_native(plain.transformer, tmp_path / "native.pth")
    from diffusers import SanaTransformer2DModel

    stock_loads = []
    real = SanaTransformer2DModel.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        stock_loads.append(args)
        return real(cls, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SanaTransformer2DModel, "from_pretrained", classmethod(counting))
        model = _model(tiny_image_pipeline_dir, native=str(native), lora=_lora(lora_names=["default"]))
    assert stock_loads == []  # the pipeline's own transformer weights are never read
    text, x, sigma = plain.encode_text(["a cat"]), torch.randn(1, 4, 32, 32), torch.tensor([0.5])
    with torch.no_grad():
        expected = plain.velocity(x, sigma, text)
        torch.testing.assert_close(model.velocity(x, sigma, text), expected)
        assert not torch.allclose(_model(tiny_image_pipeline_dir).velocity(x, sigma, text), expected)
    assert model.transformer is model.pipeline.transformer and model.lora_names == ["default"]


def test_bad_pipeline_folder_is_named(tmp_path):
    (tmp_path / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    with pytest.raises(ValueError, match="FluxPipeline"):
        _model(tmp_path)
