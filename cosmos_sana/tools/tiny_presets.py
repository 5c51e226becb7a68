"""Component configurations for random-initialised SANA pipelines.

``tiny`` presets are for CPU tests (well under 1 MB on disk). The other presets use the
published transformer and VAE architectures so shapes, memory and FLOPs are realistic;
their text encoder is a Gemma2 with the real hidden size 2304 (= ``caption_channels``)
but only :data:`REAL_TEXT_ENCODER_LAYERS` layers and the small offline tokenizer.
All weights are random: these pipelines generate noise, never pictures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Gemma2 layers in the real-shape presets' text encoder (Gemma-2-2B has 26).
REAL_TEXT_ENCODER_LAYERS = 2


@dataclass(frozen=True)
class Preset:
    """Everything needed to build one pipeline folder (``*_kwargs`` go to the class constructors)."""

    name: str
    video: bool
    description: str
    transformer: dict[str, Any]
    vae: dict[str, Any]
    text_encoder: dict[str, Any]
    scheduler: dict[str, Any] = field(default_factory=dict)

    @property
    def pipeline_class(self) -> str:
        return "SanaVideoPipeline" if self.video else "SanaPipeline"

    @property
    def transformer_class(self) -> str:
        return "SanaVideoTransformer3DModel" if self.video else "SanaTransformer2DModel"

    @property
    def vae_class(self) -> str:
        return "AutoencoderKLWan" if self.video else "AutoencoderDC"


def _scheduler(flow_shift: float) -> dict[str, Any]:
    """``DPMSolverMultistepScheduler`` in SANA's flow-matching mode."""
    return {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": flow_shift}


_TINY_TEXT = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 512,
}

_REAL_TEXT = {  # Gemma-2-2B widths, few layers
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": REAL_TEXT_ENCODER_LAYERS,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 8192,
}

_REAL_IMAGE_TRANSFORMER = {
    "in_channels": 32,
    "out_channels": 32,
    "caption_channels": 2304,
    "mlp_ratio": 2.5,
    "attention_bias": False,
    "sample_size": 32,
    "patch_size": 1,
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
}

#: DC-AE f32c32 (the SANA-1.0 autoencoder): 1024² → 32×32×32 latents.
_DCAE_F32C32 = {
    "in_channels": 3,
    "latent_channels": 32,
    "attention_head_dim": 32,
    "encoder_block_types": ["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
    "decoder_block_types": ["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
    "encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
    "decoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
    "encoder_layers_per_block": [2, 2, 2, 3, 3, 3],
    "decoder_layers_per_block": [3, 3, 3, 3, 3, 3],
    "encoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
    "decoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
    "upsample_block_type": "interpolate",
    "downsample_block_type": "Conv",
    "decoder_norm_types": "rms_norm",
    "decoder_act_fns": "silu",
    "scaling_factor": 0.41407,
}

PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        name="tiny",
        video=False,
        description="tiny random SANA for CPU tests (64x64 images, AutoencoderDC f2c4)",
        transformer={
            "in_channels": 4,
            "out_channels": 4,
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "num_layers": 2,
            "num_cross_attention_heads": 2,
            "cross_attention_head_dim": 16,
            "cross_attention_dim": 32,
            "caption_channels": 32,
            "sample_size": 32,
            "patch_size": 1,
        },
        vae={
            "in_channels": 3,
            "latent_channels": 4,
            "attention_head_dim": 8,
            "encoder_block_types": ["ResBlock", "EfficientViTBlock"],
            "decoder_block_types": ["ResBlock", "EfficientViTBlock"],
            "encoder_block_out_channels": [8, 16],
            "decoder_block_out_channels": [8, 16],
            "encoder_layers_per_block": [1, 1],
            "decoder_layers_per_block": [1, 1],
            "encoder_qkv_multiscales": [[], [5]],
            "decoder_qkv_multiscales": [[], [5]],
            "upsample_block_type": "interpolate",
            "downsample_block_type": "Conv",
            "decoder_norm_types": "rms_norm",
            "decoder_act_fns": "silu",
            "scaling_factor": 0.41407,
        },
        text_encoder=_TINY_TEXT,
        scheduler=_scheduler(3.0),
    ),
    "tiny-video": Preset(
        name="tiny-video",
        video=True,
        description="tiny random SANA-Video for CPU tests (9 frames at 64x64, AutoencoderKLWan 4x8x8)",
        transformer={
            "in_channels": 16,
            "out_channels": 16,
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "num_layers": 2,
            "num_cross_attention_heads": 2,
            "cross_attention_head_dim": 16,
            "cross_attention_dim": 32,
            "caption_channels": 32,
            "mlp_ratio": 2.5,
            "sample_size": 8,
            "patch_size": [1, 2, 2],
            "qk_norm": "rms_norm_across_heads",
            "rope_max_seq_len": 32,
        },
        vae={
            "base_dim": 3,
            "z_dim": 16,
            "dim_mult": [1, 1, 1, 1],
            "num_res_blocks": 1,
            "temperal_downsample": [False, True, True],
        },
        text_encoder=_TINY_TEXT,
        scheduler=_scheduler(3.0),
    ),
    "sana-600m": Preset(
        name="sana-600m",
        video=False,
        description="SANA 600M @1024 shapes (random weights; 2-layer Gemma2 text encoder, hidden 2304)",
        transformer={
            **_REAL_IMAGE_TRANSFORMER,
            "num_attention_heads": 36,
            "attention_head_dim": 32,
            "num_layers": 28,
            "num_cross_attention_heads": 16,
            "cross_attention_head_dim": 72,
            "cross_attention_dim": 1152,
        },
        vae=_DCAE_F32C32,
        text_encoder=_REAL_TEXT,
        scheduler=_scheduler(4.0),
    ),
    "sana-1600m": Preset(
        name="sana-1600m",
        video=False,
        description="SANA 1600M @1024 shapes (random weights; 2-layer Gemma2 text encoder, hidden 2304)",
        transformer={
            **_REAL_IMAGE_TRANSFORMER,
            "num_attention_heads": 70,
            "attention_head_dim": 32,
            "num_layers": 20,
            "num_cross_attention_heads": 20,
            "cross_attention_head_dim": 112,
            "cross_attention_dim": 2240,
        },
        vae=_DCAE_F32C32,
        text_encoder=_REAL_TEXT,
        scheduler=_scheduler(3.0),
    ),
    "sana-video-2b": Preset(
        name="sana-video-2b",
        video=True,
        description="SANA-Video 2B @480p shapes with the Wan2.1 VAE (random weights; 2-layer Gemma2, hidden 2304)",
        transformer={
            "in_channels": 16,
            "out_channels": 16,
            "num_attention_heads": 20,
            "attention_head_dim": 112,
            "num_layers": 20,
            "num_cross_attention_heads": 20,
            "cross_attention_head_dim": 112,
            "cross_attention_dim": 2240,
            "caption_channels": 2304,
            "mlp_ratio": 3.0,
            "attention_bias": False,
            "sample_size": 30,
            "patch_size": [1, 2, 2],
            "norm_elementwise_affine": False,
            "norm_eps": 1e-6,
            "qk_norm": "rms_norm_across_heads",
        },
        vae={},  # AutoencoderKLWan's defaults are the Wan2.1 VAE
        text_encoder=_REAL_TEXT,
        scheduler=_scheduler(8.0),
    ),
}

#: Names accepted by ``make-tiny --preset`` (``tiny`` + ``--video`` selects ``tiny-video``).
PRESET_CHOICES = ("tiny", "sana-600m", "sana-1600m", "sana-video-2b")


def resolve_preset(preset: str, video: bool) -> Preset:
    """The preset for a ``(name, video)`` request; video-only presets imply ``video``."""
    name = "tiny-video" if preset == "tiny" and video else preset
    if name not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESET_CHOICES)}")
    found = PRESETS[name]
    if video and not found.video:
        raise ValueError(f"preset {preset!r} is an image model; use --preset sana-video-2b or tiny for video")
    return found
