"""Speed features (fast_denoise) against the eager reference on CPU: same numbers, not speed."""

from __future__ import annotations

import copy

import pytest
import torch

from cosmos_sana_plugins.sana import fast_attention, fast_denoise, sampling
from cosmos_sana_plugins.sana.fast_attention import Bf16LinearAttnProcessor
from cosmos_sana_plugins.sana.fast_denoise import FastModel, SpeedOptions

pytestmark = pytest.mark.usefixtures("torch_single_thread")

#: relative (Frobenius) error of the bf16 processor against fp32 maths on the same bf16 weights;
#: diffusers' own bf16 path (fp32 attention core) measures ~2e-3 here, dominated by the bf16 linears.
BF16_TOLERANCE = 5e-3


def _attention(heads: int = 4, head_dim: int = 32) -> torch.nn.Module:
    from diffusers.models.attention_processor import Attention, SanaLinearAttnProcessor2_0

    torch.manual_seed(0)
    return Attention(query_dim=heads * head_dim, heads=heads, dim_head=head_dim, bias=False,
                     processor=SanaLinearAttnProcessor2_0())


def _relative(result: torch.Tensor, reference: torch.Tensor) -> float:
    return ((result.float() - reference).norm() / reference.norm()).item()


def test_bf16_processor_matches_fp32_reference() -> None:
    attn = _attention().to(torch.bfloat16)
    x = torch.randn(2, 1024, attn.inner_dim, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    reference = copy.deepcopy(attn).float()(x.float())  # fp32 maths, same (bf16-valued) weights and input
    diffusers_error = _relative(attn(x), reference)
    attn.set_processor(Bf16LinearAttnProcessor())
    ours = attn(x)
    assert ours.dtype == torch.bfloat16
    assert _relative(ours, reference) < BF16_TOLERANCE
    assert _relative(ours, reference) < 1.5 * diffusers_error


def test_bf16_processor_is_diffusers_maths_in_fp32() -> None:
    attn = _attention(heads=2, head_dim=16)
    x = torch.randn(2, 64, attn.inner_dim, generator=torch.Generator().manual_seed(2)) * 3
    reference = attn(x)
    attn.set_processor(Bf16LinearAttnProcessor())
    torch.testing.assert_close(attn(x), reference, rtol=1e-5, atol=1e-6)


def _randomise_adapters(model) -> None:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name in model.lora_names:
            for p in model.adapter_parameters(name):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@pytest.fixture()
def lora_model(tiny_image_pipeline_dir):
    from cosmos_rl.policy.config import DiffusersConfig, LoraConfig

    from cosmos_sana.config import ModelOptions
    from cosmos_sana_plugins.sana.model import SanaModel

    model = SanaModel(
        DiffusersConfig(dtype="float32", offload=False, max_prompt_length=16),
        lora_config=LoraConfig(r=4, lora_alpha=8.0, lora_names=["default", "old"], init_lora_weights="gaussian"),
        model_str=str(tiny_image_pipeline_dir),
        options=ModelOptions(device="cpu"),
    )
    _randomise_adapters(model)
    yield model
    fast_denoise.restore(model)


def _inputs(model, batch: int = 2):
    g = torch.Generator().manual_seed(3)
    latents = torch.randn(batch, *model.latent_shape(64, 64), generator=g)
    sigmas = torch.rand(batch, generator=g)
    return latents, sigmas, model.encode_text(["a red fox", "two cats on a sofa"][:batch])


def test_set_linear_attention_replaces_and_restores(lora_model) -> None:
    from diffusers.models.attention_processor import SanaLinearAttnProcessor2_0

    blocks = lora_model.transformer.transformer_blocks
    assert fast_attention.set_linear_attention(lora_model.transformer, "bf16") == len(blocks)
    assert all(isinstance(b.attn1.processor, Bf16LinearAttnProcessor) for b in blocks)
    fast_denoise.restore(lora_model)
    assert all(isinstance(b.attn1.processor, SanaLinearAttnProcessor2_0) for b in blocks)
    with pytest.raises(ValueError, match="linear_attention"):
        SpeedOptions(linear_attention="fp8")


def test_compiled_blocks_equal_eager_across_adapters_and_gradients(lora_model) -> None:
    latents, sigmas, text = _inputs(lora_model)
    with torch.no_grad(), lora_model.adapter("old"):
        expected = lora_model.velocity(latents, sigmas, text)
    eager_loss = lora_model.velocity(latents, sigmas, text).square().mean()
    eager_grads = torch.autograd.grad(eager_loss, lora_model.adapter_parameters("default"))

    fast_denoise.accelerate(lora_model, SpeedOptions(compile_blocks=True, compile_backend="eager"))
    assert all(b._compiled_call_impl is not None for b in lora_model.transformer.transformer_blocks)
    with torch.no_grad(), lora_model.adapter("old"):  # adapter and grad mode switch: guards must notice
        torch.testing.assert_close(lora_model.velocity(latents, sigmas, text), expected, rtol=1e-5, atol=1e-5)
    loss = lora_model.velocity(latents, sigmas, text).square().mean()
    grads = torch.autograd.grad(loss, lora_model.adapter_parameters("default"))
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    fast_denoise.restore(lora_model)
    assert all(b._compiled_call_impl is None for b in lora_model.transformer.transformer_blocks)


def test_static_buffer_path_samples_like_eager(lora_model) -> None:
    settings = sampling.SamplerSettings(height=64, width=64, num_steps=3, decode=False)
    text = lora_model.encode_text(["a red fox", "two cats on a sofa"])
    expected = sampling.sample(lora_model, text, sampling.generators_for([1, 2], "cpu"), settings)

    fast = FastModel(lora_model, cuda_graph_max_batch=2, capture=False)
    got = sampling.sample(fast, text, sampling.generators_for([1, 2], "cpu"), settings)
    torch.testing.assert_close(got.trajectory.latents, expected.trajectory.latents)
    assert fast.num_graphs == 1

    with lora_model.adapter("old"):  # another adapter: another static entry, other numbers
        old = sampling.sample(fast, text, sampling.generators_for([1, 2], "cpu"), settings)
    assert fast.num_graphs == 2
    assert not torch.allclose(old.latents, expected.latents)

    guided = sampling.SamplerSettings(height=64, width=64, num_steps=2, guidance_scale=4.5, decode=False)
    want = sampling.sample(lora_model, text, sampling.generators_for([1, 2], "cpu"), guided).latents
    got_guided = sampling.sample(fast, text, sampling.generators_for([1, 2], "cpu"), guided).latents
    torch.testing.assert_close(got_guided, want)
    assert fast.num_graphs == 2  # CFG doubles the batch to 4 > cuda_graph_max_batch: plain forward


def test_static_entries_are_bounded_and_skipped_with_grad(lora_model) -> None:
    fast = FastModel(lora_model, cuda_graph_max_batch=8, capture=False, max_graphs=2)
    latents, sigmas, text = _inputs(lora_model)
    with torch.no_grad():
        for batch in (1, 2):
            fast.velocity(latents[:batch], sigmas[:batch], text.select(slice(0, batch)))
        fast.velocity(latents, sigmas[0], text)  # 0-d σ is broadcast
        assert fast.num_graphs == 2
    out = fast.velocity(latents, sigmas, text)
    assert out.requires_grad
    torch.testing.assert_close(out, lora_model.velocity(latents, sigmas, text))


def test_channels_last_vae_decodes_the_same(lora_model) -> None:
    latents = torch.randn(2, *lora_model.latent_shape(64, 64), generator=torch.Generator().manual_seed(4))
    expected = lora_model.decode_latents(latents)
    fast_denoise.accelerate(lora_model, SpeedOptions(vae_channels_last=True))
    conv = next(m for m in lora_model.vae.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(lora_model.decode_latents(latents), expected, rtol=1e-5, atol=1e-5)
    fast_denoise.restore(lora_model)
    assert conv.weight.is_contiguous()


def test_text_kv_processor_matches_diffusers_armed_or_not(lora_model) -> None:
    latents, sigmas, text = _inputs(lora_model)
    text = sampling.TextConditioning(text.embeds, text.mask.clone())
    text.mask[0, 3:] = 0  # padding must stay masked
    with torch.no_grad():
        expected = lora_model.velocity(latents, sigmas, text)
        assert fast_attention.set_text_kv_attention(lora_model.transformer, True) == 2
        torch.testing.assert_close(lora_model.velocity(latents, sigmas, text), expected, rtol=1e-5, atol=1e-6)
        kv = fast_attention.text_keys_values(lora_model.transformer, text)
        with fast_attention.armed(lora_model.transformer, kv):
            torch.testing.assert_close(lora_model.velocity(latents, sigmas, text), expected, rtol=1e-5, atol=1e-6)
    assert all(b.attn2.processor.kv is None for b in lora_model.transformer.transformer_blocks)


@pytest.mark.parametrize("graph_batch", [0, 4])
def test_cached_text_kv_follows_text_adapters_and_weights(lora_model, monkeypatch, graph_batch) -> None:
    computed = []
    original = fast_attention.text_keys_values
    monkeypatch.setattr(fast_attention, "text_keys_values", lambda t, x: computed.append(1) or original(t, x))
    fast = fast_denoise.accelerate(lora_model, SpeedOptions(cache_text_kv=True, cuda_graph_max_batch=graph_batch))
    fast.capture = False
    settings = sampling.SamplerSettings(height=64, width=64, num_steps=3, guidance_scale=3.0, decode=False)
    text = lora_model.encode_text(["a red fox", "two cats on a sofa"])

    def both(texts=text):
        return tuple(sampling.sample(m, texts, sampling.generators_for([1, 2], "cpu"), settings).latents
                     for m in (fast, lora_model))

    got, want = both()
    torch.testing.assert_close(got, want)
    assert len(computed) == 1  # once for the three steps (CFG: one cat of negative + prompts)
    latents, sigmas, _ = _inputs(lora_model)
    with torch.no_grad():
        fast.velocity(latents, sigmas, text)
        fast.velocity(latents, sigmas, text)
    assert len(computed) == 2  # a new text object; then reused
    with torch.no_grad():  # an in-place update of a cross-attention LoRA weight invalidates the cache
        next(p for n, p in lora_model.transformer.named_parameters() if "attn2.to_k.lora_B.default" in n).add_(0.5)
    got, want = both()
    torch.testing.assert_close(got, want)
    with lora_model.adapter("old"):
        got, want = both(lora_model.encode_text(["a green tree", "a blue car"]))
    torch.testing.assert_close(got, want)
    assert all(b.attn2.processor.kv is None for b in lora_model.transformer.transformer_blocks)


def test_using_another_view_keeps_separate_entries(lora_model) -> None:
    from cosmos_sana_plugins.trainers.policies import TransformerView

    fast = FastModel(lora_model, cuda_graph_max_batch=2, capture=False)
    other = copy.deepcopy(lora_model.transformer)
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    view = TransformerView(lora_model, other)
    latents, sigmas, text = _inputs(lora_model)
    with torch.no_grad():
        first = fast.velocity(latents, sigmas, text)
        with fast.using(view) as through_view:
            expected = view.velocity(latents, sigmas, text)
            torch.testing.assert_close(through_view.velocity(latents, sigmas, text), expected)
        torch.testing.assert_close(fast.velocity(latents, sigmas, text), first)
    assert fast.num_graphs == 2 and fast.model is lora_model


def test_video_transformer_keeps_its_own_processors(tiny_video_pipeline_dir) -> None:
    from diffusers import SanaVideoTransformer3DModel

    transformer = SanaVideoTransformer3DModel.from_pretrained(tiny_video_pipeline_dir, subfolder="transformer")
    assert fast_attention.set_linear_attention(transformer, "bf16") == 0
    assert fast_attention.set_text_kv_attention(transformer, True) == 0
    assert not fast_attention.text_kv_enabled(transformer)
