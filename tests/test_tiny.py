"""The offline random SANA builder: tiny folders load in stock diffusers, presets carry real shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from cosmos_sana.tools.tiny import build_pipeline, parameter_counts
from cosmos_sana.tools.tiny_presets import PRESETS, resolve_preset


def _weights(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.safetensors"))}


def test_tiny_image_folder_loads_and_samples(tiny_image_pipeline_dir: Path) -> None:
    from diffusers import AutoencoderDC, DPMSolverMultistepScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Model, GemmaTokenizerFast

    size = sum(p.stat().st_size for p in tiny_image_pipeline_dir.rglob("*") if p.is_file())
    assert size < 1_000_000
    pipe = SanaPipeline.from_pretrained(tiny_image_pipeline_dir)
    assert isinstance(pipe.transformer, SanaTransformer2DModel)
    assert isinstance(pipe.vae, AutoencoderDC)
    assert isinstance(pipe.text_encoder, Gemma2Model)
    assert isinstance(pipe.tokenizer, GemmaTokenizerFast)
    assert isinstance(pipe.scheduler, DPMSolverMultistepScheduler)
    assert pipe.scheduler.config.prediction_type == "flow_prediction"
    assert pipe.scheduler.config.flow_shift == 3.0
    assert pipe.vae_scale_factor == 2  # two DC-AE stages: 64² pixels → 32² latents = sample_size
    assert pipe.transformer.config.caption_channels == pipe.text_encoder.config.hidden_size == 32

    ids = pipe.tokenizer(["a red cat"], padding="max_length", max_length=8).input_ids[0]
    assert ids[0] == 2 and ids[-1] == 0  # <bos> first, <pad> fills
    assert (pipe.tokenizer.pad_token_id, pipe.tokenizer.eos_token_id, pipe.tokenizer.unk_token_id) == (0, 1, 3)

    image = pipe(
        "a red cat",
        height=64,
        width=64,
        num_inference_steps=2,
        use_resolution_binning=False,
        complex_human_instruction=None,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
    ).images
    assert image.shape == (1, 3, 64, 64)
    assert torch.isfinite(image).all()


def test_tiny_video_folder_loads_and_samples(tiny_video_pipeline_dir: Path) -> None:
    from diffusers import AutoencoderKLWan, SanaVideoPipeline, SanaVideoTransformer3DModel

    pipe = SanaVideoPipeline.from_pretrained(tiny_video_pipeline_dir)
    assert isinstance(pipe.transformer, SanaVideoTransformer3DModel)
    assert isinstance(pipe.vae, AutoencoderKLWan)
    assert (pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial) == (4, 8)
    frames = pipe(
        "a cat running",
        height=64,
        width=64,
        frames=9,
        num_inference_steps=2,
        use_resolution_binning=False,
        complex_human_instruction=None,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
    ).frames
    assert frames.shape == (1, 9, 3, 64, 64)  # 9 frames → 1 + (9-1)/4 = 3 latent frames, decoded back to 9
    assert torch.isfinite(frames).all()


def test_same_seed_is_byte_identical_and_seed_matters(tmp_path: Path, tiny_image_pipeline_dir: Path) -> None:
    again = build_pipeline(tmp_path / "again", seed=0)
    other = build_pipeline(tmp_path / "other", seed=1)
    reference = _weights(tiny_image_pipeline_dir)
    assert set(reference) == {
        "text_encoder/model.safetensors",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
    }
    assert _weights(again) == reference
    different = _weights(other)
    assert all(different[name] != reference[name] for name in reference)


def test_dtype_is_stored(tmp_path: Path) -> None:
    folder = build_pipeline(tmp_path / "bf16", dtype=torch.bfloat16)
    with safe_open(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}


@pytest.mark.parametrize(
    ("preset", "inner", "layers", "cross_heads", "cross_dim", "params"),
    [
        ("sana-600m", 36 * 32, 28, 16, 72, 0.59e9),
        ("sana-1600m", 70 * 32, 20, 20, 112, 1.60e9),
        ("sana-video-2b", 20 * 112, 20, 20, 112, 2.06e9),
    ],
)
def test_real_presets_have_documented_shapes(preset, inner, layers, cross_heads, cross_dim, params) -> None:
    chosen = resolve_preset(preset, video=False)
    cfg = chosen.transformer
    assert cfg["num_attention_heads"] * cfg["attention_head_dim"] == inner
    assert cfg["num_cross_attention_heads"] * cfg["cross_attention_head_dim"] == inner == cfg["cross_attention_dim"]
    assert (cfg["num_layers"], cfg["num_cross_attention_heads"], cfg["cross_attention_head_dim"]) == (
        layers,
        cross_heads,
        cross_dim,
    )
    assert cfg["caption_channels"] == chosen.text_encoder["hidden_size"] == 2304
    counts = parameter_counts(preset)
    assert counts["transformer"] == pytest.approx(params, rel=0.01)


def test_real_image_vae_is_dcae_f32c32_and_video_vae_is_wan21() -> None:
    import diffusers

    dcae = PRESETS["sana-1600m"].vae
    assert len(dcae["encoder_block_out_channels"]) == 6  # 2**5 = 32× downsampling
    assert (dcae["latent_channels"], dcae["scaling_factor"]) == (32, 0.41407)
    with torch.device("meta"):
        latent = diffusers.AutoencoderDC(**dcae).encode(torch.empty(1, 3, 1024, 1024)).latent
        wan = diffusers.AutoencoderKLWan(**PRESETS["sana-video-2b"].vae)
    assert latent.shape == (1, 32, 32, 32)
    assert (wan.config.z_dim, wan.config.scale_factor_spatial, wan.config.scale_factor_temporal) == (16, 8, 4)
    assert PRESETS["sana-600m"].vae is dcae


def test_preset_errors_name_the_preset() -> None:
    with pytest.raises(ValueError, match="'sana-1600m' is an image model"):
        resolve_preset("sana-1600m", video=True)
    with pytest.raises(ValueError, match="unknown preset 'sana-9b'"):
        resolve_preset("sana-9b", video=False)
    assert resolve_preset("sana-video-2b", video=False).video


def test_make_tiny_cli_writes_a_loadable_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cosmos_sana.cli import main

    assert main(["make-tiny", "--out", str(tmp_path / "v"), "--video", "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "v")
    index = json.loads((tmp_path / "v" / "model_index.json").read_text())
    assert index["_class_name"] == "SanaVideoPipeline"
    assert index["transformer"] == ["diffusers", "SanaVideoTransformer3DModel"]
    assert "random" in (tmp_path / "v" / "README.md").read_text()
