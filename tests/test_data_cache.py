"""Latent/text-embedding cache: a second epoch decodes no media; keys follow content, caption and settings."""

from __future__ import annotations

import torch
from fixtures_data import BLUE, solid, write_image

from cosmos_sana_plugins.datasets.latent_cache import encode_batch
from cosmos_sana_plugins.datasets.media import build_images
from cosmos_sana_plugins.datasets.params import ImageDataParams


class FakeEncoder:
    """Deterministic: latents = 2·pixels subsampled by 4; prompt_embeds = caption length."""

    def __init__(self):
        self.calls = 0
        self.rows = 0

    def __call__(self, pixels, prompts):
        self.calls += 1
        self.rows += len(prompts)
        return {"latents": pixels[:, :, ::4, ::4] * 2,
                "prompt_embeds": torch.tensor([[float(len(p))] for p in prompts])}


def _dataset(path, cache_dir, config=None, size=(8, 8)):
    params = ImageDataParams(path=str(path), size=size, cache_dir=str(cache_dir), cache_model_id="tiny-sana")
    return build_images(params, cosmos_config=config)


def _epoch(data, encoder, batch_size=2):
    out = []
    for start in range(0, len(data), batch_size):
        items = [data[i] for i in range(start, min(start + batch_size, len(data)))]
        out.append(encode_batch(items, encoder))
    return {name: torch.cat([batch[name] for batch in out]) for name in out[0]}


def test_second_epoch_decodes_nothing(image_folder, tmp_path):
    cache = tmp_path / "cache"
    first, encoder = _dataset(image_folder, cache), FakeEncoder()
    tensors = _epoch(first, encoder)
    assert first.decode_count == 3 and encoder.rows == 3
    assert len(list(cache.rglob("*.safetensors"))) == 3
    assert tensors["latents"].shape == (3, 3, 2, 2)
    assert tensors["prompt_embeds"].flatten().tolist() == [19.0, 5.0, 4.0]  # "a red and blue card", "green", "grey"

    second, encoder2 = _dataset(image_folder, cache), FakeEncoder()
    again = _epoch(second, encoder2)
    assert second.decode_count == 0 and encoder2.calls == 0
    assert all("pixels" not in second[i] for i in range(len(second)))
    assert torch.equal(again["latents"], tensors["latents"]) and torch.equal(again["prompt_embeds"],
                                                                              tensors["prompt_embeds"])


def test_key_follows_content_caption_size_and_chi(image_folder, tmp_path):
    cache = tmp_path / "cache"
    _epoch(_dataset(image_folder, cache), FakeEncoder())

    write_image(image_folder / "b.webp", solid(32, 32, BLUE))  # new content
    (image_folder / "sub" / "c.txt").write_text("gray")  # new caption
    changed = _dataset(image_folder, cache)
    assert ["encoded" in changed[i] for i in range(3)] == [True, False, False]

    resized = _dataset(image_folder, cache, size=(16, 16))
    assert not any("encoded" in resized[i] for i in range(3))
    chi = _dataset(image_folder, cache, config={"custom": {"model": {"complex_human_instruction": "image"}}})
    assert not any("encoded" in chi[i] for i in range(3))


def test_real_tiny_vae_latents_are_cached_exactly(image_folder, tmp_path, tiny_image_pipeline_dir):
    from diffusers import AutoencoderDC

    vae = AutoencoderDC.from_pretrained(tiny_image_pipeline_dir / "vae").eval()
    calls = []

    @torch.no_grad()
    def encoder(pixels, prompts):
        calls.append(len(prompts))
        return {"latents": vae.encode(pixels).latent * vae.config.scaling_factor}

    uncached = build_images(ImageDataParams(path=str(image_folder), size=(64, 64)))
    direct = encoder(torch.stack([uncached[i]["pixels"] for i in range(3)]), ["", "", ""])["latents"]

    first = _epoch(_dataset(image_folder, tmp_path / "cache", size=(64, 64)), encoder, batch_size=3)
    second_data = _dataset(image_folder, tmp_path / "cache", size=(64, 64))
    second = _epoch(second_data, encoder, batch_size=3)
    assert calls == [3, 3]  # the direct reference, then the first epoch; the second hits the cache
    assert second_data.decode_count == 0
    assert first["latents"].shape == (3, 4, 32, 32)
    assert torch.equal(first["latents"], direct) and torch.equal(second["latents"], direct)
