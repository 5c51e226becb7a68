"""Native SANA checkpoints ↔ diffusers transformers: key mapping, sources, strictness, convert-native."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cosmos_sana_plugins.sana import native_keys as nk
from cosmos_sana_plugins.sana.native_checkpoint import (
    ENV_SOURCE,
    NativeCheckpointError,
    load_native_transformer,
    read_native_state_dict,
    resolve_source,
    save_native,
)

IMAGE = {  # SANA-1.0 layout (no qk norm), tiny widths
    "in_channels": 4, "out_channels": 4, "num_attention_heads": 2, "attention_head_dim": 8, "num_layers": 2,
    "num_cross_attention_heads": 2, "cross_attention_head_dim": 8, "cross_attention_dim": 16,
    "caption_channels": 8, "sample_size": 8,
}
SPRINT = {**IMAGE, "qk_norm": "rms_norm_across_heads", "guidance_embeds": True}
VIDEO = {
    "in_channels": 16, "out_channels": 16, "num_attention_heads": 2, "attention_head_dim": 8, "num_layers": 2,
    "num_cross_attention_heads": 2, "cross_attention_head_dim": 8, "cross_attention_dim": 16,
    "caption_channels": 8, "mlp_ratio": 2.5, "sample_size": 4, "patch_size": [1, 2, 2], "rope_max_seq_len": 32,
}


def _transformer(config: dict, seed: int = 0) -> torch.nn.Module:
    from diffusers import SanaTransformer2DModel, SanaVideoTransformer3DModel

    torch.manual_seed(seed)
    cls = SanaVideoTransformer3DModel if "rope_max_seq_len" in config else SanaTransformer2DModel
    model = cls(**config).eval()
    with torch.no_grad():  # diffusers zero-inits some layers; make every weight informative
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _forward(model: torch.nn.Module, video: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    latents = torch.randn((1, 16, 2, 4, 4) if video else (1, 4, 4, 4), generator=g)
    text = torch.randn(1, 5, 8, generator=g)
    extra = {"guidance": torch.tensor([4.5])} if model.config.get("guidance_embeds") else {}
    with torch.no_grad():
        return model(latents, encoder_hidden_states=text, timestep=torch.tensor([500.0]), return_dict=False, **extra)[0]


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# --------------------------------------------------------------------------- key mapping


def test_fused_tensors_split_into_the_documented_rows() -> None:
    model = _transformer(IMAGE)
    native = nk.diffusers_to_native(model.state_dict())
    qkv = torch.arange(48 * 16, dtype=torch.float32).reshape(48, 16)  # 3 × (2 heads × 8) rows
    kv_bias = torch.arange(32, dtype=torch.float32)
    native["blocks.0.attn.qkv.weight"], native["blocks.0.cross_attn.kv_linear.bias"] = qkv, kv_bias
    mapped = nk.native_to_diffusers(native)
    assert torch.equal(mapped["transformer_blocks.0.attn1.to_k.weight"], qkv[16:32])
    assert torch.equal(mapped["transformer_blocks.0.attn1.to_v.weight"], qkv[32:])
    assert torch.equal(mapped["transformer_blocks.0.attn2.to_v.bias"], torch.arange(16.0, 32.0))
    to_q = mapped["transformer_blocks.0.attn1.to_q.weight"]
    assert to_q.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()  # cloned, not a view
    assert torch.equal(mapped["patch_embed.proj.weight"], native["x_embedder.proj.weight"])
    assert torch.equal(mapped["time_embed.emb.timestep_embedder.linear_2.bias"], native["t_embedder.mlp.2.bias"])
    assert torch.equal(mapped["scale_shift_table"], native["final_layer.scale_shift_table"])


@pytest.mark.parametrize("config", [IMAGE, SPRINT, VIDEO], ids=["image", "sprint", "video"])
@pytest.mark.parametrize("linear_ffn", [False, True], ids=["conv-ffn", "linear-ffn"])
def test_native_diffusers_native_round_trip_is_bit_exact(config: dict, linear_ffn: bool) -> None:
    native = nk.diffusers_to_native(_transformer(config).state_dict(), linear_ffn=linear_ffn)
    ffn = "blocks.1.mlp.inverted_conv.linear.weight" if linear_ffn else "blocks.1.mlp.inverted_conv.conv.weight"
    assert native[ffn].ndim == (2 if linear_ffn else 4)
    if config is SPRINT:
        assert "cfg_embedder.mlp.2.weight" in native and "blocks.0.cross_attn.k_norm.weight" in native
    if config is VIDEO:
        assert native["x_embedder.proj.weight"].ndim == 5 and "blocks.0.mlp.t_conv.weight" in native
    back = nk.diffusers_to_native(nk.native_to_diffusers(native), linear_ffn=linear_ffn)
    _assert_same_weights(back, native)


def test_training_only_native_keys_are_dropped() -> None:
    native = nk.diffusers_to_native(_transformer(IMAGE).state_dict())
    extras = {"pos_embed": torch.zeros(1, 16, 16), "y_embedder.y_embedding": torch.zeros(300, 8),
              "logvar_linear.weight": torch.zeros(1, 16), "logvar_linear.bias": torch.zeros(1)}
    assert nk.native_to_diffusers({**native, **extras}).keys() == nk.native_to_diffusers(native).keys()


def test_unknown_native_keys_are_all_named() -> None:
    native = nk.diffusers_to_native(_transformer(IMAGE).state_dict())
    native["blocks.0.attn.rope.weight"] = torch.zeros(1)
    native["extra_head.bias"] = torch.zeros(1)
    with pytest.raises(nk.NativeKeyError) as info:
        nk.native_to_diffusers(native)
    assert info.value.keys == ["blocks.0.attn.rope.weight", "extra_head.bias"]
    assert "extra_head.bias" in str(info.value)


def test_diffusers_key_without_native_form_is_refused() -> None:
    state = _transformer(IMAGE).state_dict()
    del state["transformer_blocks.1.attn1.to_v.weight"]
    state["controlnet.weight"] = torch.zeros(1)
    with pytest.raises(nk.NativeKeyError) as info:
        nk.diffusers_to_native(state)
    assert info.value.keys == ["blocks.1.attn.qkv.weight", "controlnet.weight"]


def test_lora_on_fused_qkv_keeps_the_weight_update() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 16, generator=g), torch.randn(48, 4, generator=g)
    ffn_a, ffn_b = torch.randn(4, 16, generator=g), torch.randn(80, 4, generator=g)
    mapped = nk.native_lora_to_diffusers(
        {
            "base_model.model.blocks.3.attn.qkv.lora_A.default.weight": a,
            "base_model.model.blocks.3.attn.qkv.lora_B.default.weight": b,
            "blocks.0.mlp.inverted_conv.linear.lora_A.weight": ffn_a,
            "blocks.0.mlp.inverted_conv.linear.lora_B.weight": ffn_b,
        },
        prefix="transformer.",
    )
    delta = b @ a
    for i, name in enumerate(("to_q", "to_k", "to_v")):
        module = f"transformer.transformer_blocks.3.attn1.{name}"
        update = mapped[f"{module}.lora_B.weight"] @ mapped[f"{module}.lora_A.weight"]
        assert torch.allclose(update, delta[16 * i : 16 * (i + 1)])
    assert mapped["transformer.transformer_blocks.0.ff.conv_inverted.lora_B.weight"].shape == (80, 4, 1, 1)
    with pytest.raises(nk.NativeKeyError, match="y_embedder.y_proj.fc1.lora_A.weight"):
        nk.native_lora_to_diffusers({"y_embedder.y_proj.fc1.lora_A.weight": a})


@pytest.mark.parametrize(
    ("name", "video", "config", "params"),
    [
        ("SANA 600M", False, {"num_attention_heads": 36, "attention_head_dim": 32, "num_layers": 28,
                              "num_cross_attention_heads": 16, "cross_attention_head_dim": 72,
                              "cross_attention_dim": 1152}, 0.59e9),
        ("SANA 1600M", False, {"num_attention_heads": 70, "attention_head_dim": 32, "num_layers": 20,
                               "num_cross_attention_heads": 20, "cross_attention_head_dim": 112,
                               "cross_attention_dim": 2240}, 1.6e9),
        ("SANA-Video 2B", True, {"in_channels": 16, "out_channels": 16, "num_attention_heads": 20,
                                 "attention_head_dim": 112, "num_layers": 20, "num_cross_attention_heads": 20,
                                 "cross_attention_head_dim": 112, "cross_attention_dim": 2240, "mlp_ratio": 3.0,
                                 "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads"}, 2.0e9),
    ],
)
def test_real_architectures_are_inferred_from_shapes(name: str, video: bool, config: dict, params: float) -> None:
    from diffusers import SanaTransformer2DModel, SanaVideoTransformer3DModel

    cls = SanaVideoTransformer3DModel if video else SanaTransformer2DModel
    with torch.device("meta"):
        model = cls(**config)
        native = nk.diffusers_to_native(model.state_dict())
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.1)
    assert nk.architecture_name(native) == name
    class_name, inferred = nk.infer_transformer_config(native)
    assert class_name == cls.__name__
    for key, value in config.items():
        assert inferred[key] == value, key
    assert inferred["caption_channels"] == 2304 and inferred["qk_norm"] == config.get("qk_norm")


# --------------------------------------------------------------------------- files and sources


@pytest.mark.parametrize(
    ("config", "video"), [(IMAGE, False), (SPRINT, False), (VIDEO, True)], ids=["image", "sprint", "video"]
)
def test_native_pth_loads_into_an_identical_transformer(tmp_path: Path, config: dict, video: bool) -> None:
    model = _transformer(config)
    path = save_native(model, tmp_path / "model.pth", linear_ffn=True)
    assert "blocks.0.mlp.point_conv.linear.weight" in torch.load(path, weights_only=True)["state_dict"]
    loaded = load_native_transformer(path, base_config=dict(model.config))
    assert type(loaded) is type(model)
    _assert_same_weights(loaded.state_dict(), model.state_dict())
    assert torch.equal(_forward(loaded, video), _forward(model, video))


def test_checkpoint_with_numpy_rng_state_and_ema(tmp_path: Path) -> None:
    import numpy as np

    model, ema = _transformer(IMAGE, seed=0), _transformer(IMAGE, seed=1)
    path = tmp_path / "epoch_1.pth"
    torch.save({"state_dict": nk.diffusers_to_native(model.state_dict()),
                "state_dict_ema": nk.diffusers_to_native(ema.state_dict()),
                "rng_state": {"numpy": np.random.get_state()}, "epoch": 1}, path)
    picked = load_native_transformer(path, base_config=dict(model.config), use_ema=True)
    _assert_same_weights(picked.state_dict(), ema.state_dict())
    plain = load_native_transformer(path, base_config=dict(model.config))
    _assert_same_weights(plain.state_dict(), model.state_dict())

    bare = tmp_path / "bare.pth"  # a bare state dict, in torch's legacy (non-zip, no-mmap) format
    torch.save(nk.diffusers_to_native(model.state_dict()), bare, _use_new_zipfile_serialization=False)
    assert read_native_state_dict(bare).keys() == nk.diffusers_to_native(model.state_dict()).keys()
    with pytest.raises(NativeCheckpointError, match="state_dict_ema"):
        read_native_state_dict(bare, use_ema=True)


def test_pickled_objects_are_refused(tmp_path: Path) -> None:
    from pathlib import PurePosixPath

    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {}, "extra": PurePosixPath("/etc")}, path)  # any non-allowlisted class
    with pytest.raises(NativeCheckpointError, match="evil.pth"):
        read_native_state_dict(path)


def test_missing_and_mis_shaped_keys_are_listed(tmp_path: Path) -> None:
    model = _transformer(IMAGE)
    native = nk.diffusers_to_native(model.state_dict())
    del native["blocks.1.cross_attn.proj.bias"]
    native["final_layer.linear.bias"] = torch.zeros(5)
    path = tmp_path / "broken.safetensors"
    save_file(native, path)
    with pytest.raises(NativeCheckpointError) as info:
        load_native_transformer(path, base_config=dict(model.config))
    message = str(info.value)
    assert "broken.safetensors" in message
    assert "missing from checkpoint: transformer_blocks.1.attn2.to_out.0.bias" in message
    assert "shape mismatch proj_out.bias: checkpoint (5,) vs model (4,)" in message


def test_unknown_width_needs_a_config(tmp_path: Path) -> None:
    path = save_native(_transformer(IMAGE), tmp_path / "model.safetensors")
    with pytest.raises(NativeCheckpointError, match="cannot infer attention heads"):
        load_native_transformer(path)


def test_sharded_safetensors_index_and_folder_source(tmp_path: Path) -> None:
    model = _transformer(VIDEO)
    native = nk.diffusers_to_native(model.state_dict())
    keys = sorted(native)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for shard, names in shards.items():
        save_file({k: native[k].contiguous() for k in names}, tmp_path / shard)
    index = {"metadata": {}, "weight_map": {k: s for s, names in shards.items() for k in names}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert resolve_source(tmp_path) == tmp_path / "model.safetensors.index.json"
    loaded = load_native_transformer(tmp_path, base_config=dict(model.config))
    assert torch.equal(_forward(loaded, True), _forward(model, True))

    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(NativeCheckpointError, match="model-00002-of-00002.safetensors"):
        read_native_state_dict(tmp_path / "model.safetensors.index.json")


def test_env_source_and_missing_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SOURCE, raising=False)
    with pytest.raises(NativeCheckpointError, match=ENV_SOURCE):
        resolve_source(None)
    target = save_native(_transformer(IMAGE), tmp_path / "sana.pth")
    monkeypatch.setenv(ENV_SOURCE, str(target))
    assert resolve_source(None) == target
    with pytest.raises(NativeCheckpointError, match="nowhere.pth"):
        resolve_source(tmp_path / "nowhere.pth")


def test_hf_source_offline_names_what_to_download(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(NativeCheckpointError) as info:
        resolve_source("hf://yitongl/SANA_LinearFFN/SANA_LinearFFN.pth")
    assert "huggingface-cli download yitongl/SANA_LinearFFN SANA_LinearFFN.pth" in str(info.value)
    with pytest.raises(NativeCheckpointError, match="hf://ORG/REPO"):
        resolve_source("hf://only-a-repo")


# --------------------------------------------------------------------------- convert-native


def test_convert_native_writes_a_loadable_pipeline(tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    from diffusers import SanaPipeline

    from cosmos_sana.cli import main

    base = SanaPipeline.from_pretrained(tiny_image_pipeline_dir)
    trained = base.transformer
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.25)
    source = save_native(trained, tmp_path / "trained.pth")
    out = tmp_path / "converted"
    assert main(["convert-native", str(source), "--base", str(tiny_image_pipeline_dir), "--out", str(out)]) == 0

    pipe = SanaPipeline.from_pretrained(out)
    _assert_same_weights(pipe.transformer.state_dict(), trained.state_dict())
    vae = "vae/diffusion_pytorch_model.safetensors"
    assert (out / vae).read_bytes() == (tiny_image_pipeline_dir / vae).read_bytes()
    kwargs = {"prompt": "a red cat", "height": 64, "width": 64, "num_inference_steps": 2, "guidance_scale": 1.0,
              "output_type": "latent", "use_resolution_binning": False}
    expected = base(**kwargs, generator=torch.Generator().manual_seed(0)).images
    assert torch.equal(pipe(**kwargs, generator=torch.Generator().manual_seed(0)).images, expected)

    assert main(["convert-native", str(source), "--base", str(tiny_image_pipeline_dir), "--out", str(out)]) == 1
