"""Each built-in scorer, loaded from local files in its real format, against a hand computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cosmos_sana.config import RewardRef
from cosmos_sana.plugin_manager import installed_plugins
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.rewards.weights import WeightsMissingError

CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
PROMPTS = ["a red cat", "a blue dog on the mat"]


def build(name: str, **args) -> ScorerSet:
    return ScorerSet.build([RewardRef(name=name, args=args)], installed_plugins(), device="cpu")


def images(seed: int = 0, n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def clip_cosines(folder, pixels_01: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit_scale.exp(), cos(image_i, text_i)) from the raw CLIPModel, preprocessed by hand."""
    from transformers import AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(folder).eval()
    tokens = AutoTokenizer.from_pretrained(folder)(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        image = model.get_image_features(pixel_values=(pixels_01 - CLIP_MEAN) / CLIP_STD)
        text = model.get_text_features(**tokens)
    return model.logit_scale.exp().detach(), F.cosine_similarity(image, text, dim=-1)


def test_pickscore_is_scaled_cosine_over_26(tiny_clip_dir):
    media = images(0)
    scores = build("pickscore", model=str(tiny_clip_dir), processor=str(tiny_clip_dir)).score(media, PROMPTS)
    scale, cos = clip_cosines(tiny_clip_dir, media, PROMPTS)
    assert scale.item() == pytest.approx(torch.tensor(3.0).exp().item(), rel=1e-5)
    assert scores.components["pickscore"] == pytest.approx((scale * cos / 26).tolist(), abs=1e-5)
    assert scores.total == scores.components["pickscore"]


def test_clipscore_is_logits_over_100_and_chunking_changes_nothing(tiny_clip_dir):
    media = images(1, n=3)
    prompts = PROMPTS + ["the mat"]
    whole = build("clipscore", model=str(tiny_clip_dir)).score(media, prompts).total
    chunked = build("clipscore", model=str(tiny_clip_dir), max_batch=2).score(media, prompts).total
    scale, cos = clip_cosines(tiny_clip_dir, media, prompts)
    assert whole == pytest.approx((scale * cos / 100).tolist(), abs=1e-6)
    assert chunked == pytest.approx(whole, abs=1e-6)


def test_clip_processor_resizes_larger_images(tiny_clip_dir):
    """A 64² image scores like its bicubic 32² downscale (the processor resizes on the fly)."""
    big = images(2, n=1, size=64)
    small = F.interpolate(big, size=(32, 32), mode="bicubic", antialias=True, align_corners=False).clamp(0, 1)
    scorer = build("clipscore", model=str(tiny_clip_dir))
    assert scorer.score(big, PROMPTS[:1]).total == pytest.approx(scorer.score(small, PROMPTS[:1]).total, abs=2e-3)


def test_aesthetic_is_mlp_of_normalised_image_embedding(tiny_clip_dir, tmp_path):
    from transformers import CLIPModel

    from cosmos_sana_plugins.rewards.tiny import tiny_aesthetic_head

    head_file = tiny_aesthetic_head(tmp_path / "sac+logos+ava1-l14-linearMSE.pth", width=16)
    head = torch.load(head_file, weights_only=True)
    media = images(4)
    got = build("aesthetic", model=str(tiny_clip_dir), head=str(head_file))
    model = CLIPModel.from_pretrained(tiny_clip_dir).eval()
    with torch.no_grad():
        x = F.normalize(model.get_image_features(pixel_values=(media - CLIP_MEAN) / CLIP_STD), dim=-1)
        for index in (0, 2, 4, 6, 7):
            x = F.linear(x, head[f"layers.{index}.weight"], head[f"layers.{index}.bias"])
    assert got.score(media, ["", ""]).total == pytest.approx(x.squeeze(-1).tolist(), abs=1e-5)


def test_aesthetic_without_head_names_the_download(tiny_clip_dir):
    with pytest.raises(WeightsMissingError, match="improved-aesthetic-predictor.*sac\\+logos"):
        build("aesthetic", model=str(tiny_clip_dir))


def test_hps_is_cosine_of_open_clip_features(tiny_hps):
    import open_clip

    arch, checkpoint = tiny_hps
    media = images(5)
    got = build("hpsv2.1", arch=arch, checkpoint=str(checkpoint)).score(media, PROMPTS).total
    model = open_clip.create_model(arch).eval()
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    with torch.no_grad():
        image = model.encode_image((media - CLIP_MEAN) / CLIP_STD)
        text = model.encode_text(open_clip.get_tokenizer(arch)(PROMPTS))
    assert got == pytest.approx(F.cosine_similarity(image, text, dim=-1).tolist(), abs=1e-5)


def blip_vit_by_hand(state: dict, pixels: torch.Tensor, heads: int, patch: int) -> torch.Tensor:
    """BLIP's ViT written out from its raw (timm-named) checkpoint tensors."""
    p = lambda k: state[f"blip.visual_encoder.{k}"]  # noqa: E731
    x = F.conv2d(pixels, p("patch_embed.proj.weight"), p("patch_embed.proj.bias"), stride=patch)
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([p("cls_token").expand(x.shape[0], -1, -1), x], dim=1) + p("pos_embed")
    batch, tokens, width = x.shape
    block = 0
    while f"blip.visual_encoder.blocks.{block}.norm1.weight" in state:
        b = f"blocks.{block}."
        h = F.layer_norm(x, (width,), p(b + "norm1.weight"), p(b + "norm1.bias"), eps=1e-6)
        qkv = F.linear(h, p(b + "attn.qkv.weight"), p(b + "attn.qkv.bias"))
        q, k, v = qkv.reshape(batch, tokens, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-1, -2) * (width // heads) ** -0.5, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(batch, tokens, width)
        x = x + F.linear(out, p(b + "attn.proj.weight"), p(b + "attn.proj.bias"))
        h = F.layer_norm(x, (width,), p(b + "norm2.weight"), p(b + "norm2.bias"), eps=1e-6)
        h = F.linear(F.gelu(F.linear(h, p(b + "mlp.fc1.weight"), p(b + "mlp.fc1.bias"))),
                     p(b + "mlp.fc2.weight"), p(b + "mlp.fc2.bias"))
        x = x + h
        block += 1
    return F.layer_norm(x, (width,), p("norm.weight"), p("norm.bias"), eps=1e-6)


def test_imagereward_matches_blip_computed_by_hand(tiny_image_reward):
    from transformers import AutoTokenizer, BlipTextConfig
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    from cosmos_sana_plugins.rewards.tiny import BLIP_TINY

    files = tiny_image_reward
    media = images(6)
    got = build(
        "imagereward", checkpoint=str(files["checkpoint"]), med_config=str(files["med_config"]),
        tokenizer=str(files["tokenizer"]), vision=BLIP_TINY,
    ).score(media, PROMPTS).total

    state = files["state"]
    with torch.no_grad():
        image_embeds = blip_vit_by_hand(state, (media - CLIP_MEAN) / CLIP_STD, BLIP_TINY["heads"], BLIP_TINY["patch_size"])
        text = BlipTextModel(BlipTextConfig(
            vocab_size=20, hidden_size=32, encoder_hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=40), add_pooling_layer=False).eval()
        text.load_state_dict({k.removeprefix("blip.text_encoder."): v for k, v in state.items()
                              if k.startswith("blip.text_encoder.")})
        tokens = AutoTokenizer.from_pretrained(files["tokenizer"])(
            PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
        assert tokens.input_ids.shape == (2, 35)
        x = text(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                 encoder_hidden_states=image_embeds).last_hidden_state[:, 0]
        for index in (0, 2, 4, 6, 7):
            x = F.linear(x, state[f"mlp.layers.{index}.weight"], state[f"mlp.layers.{index}.bias"])
    expected = (x.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072
    assert got == pytest.approx(expected.tolist(), abs=1e-4)
    assert abs(got[0] - got[1]) > 1e-3  # the two prompts/images are told apart


def test_image_scorer_on_video_averages_every_4th_frame(tiny_clip_dir):
    """A 9-frame clip through CLIPScore = the mean of frames 0, 4 and 8 scored as images."""
    frames = images(7, n=9)
    scorer = build("clipscore", model=str(tiny_clip_dir))
    per_frame = scorer.score(frames, ["a red cat"] * 9).total
    video = scorer.score(frames.unsqueeze(0), ["a red cat"]).total
    assert video == pytest.approx([(per_frame[0] + per_frame[4] + per_frame[8]) / 3], abs=1e-6)


def test_missing_hub_weights_name_the_download(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsMissingError, match="huggingface-cli download xswu/HPSv2 HPS_v2.1_compressed.pt"):
        build("hpsv2.1")
    with pytest.raises(WeightsMissingError, match="args.model.*huggingface-cli download no-such-org/no-such-model"):
        build("clipscore", model="no-such-org/no-such-model")
