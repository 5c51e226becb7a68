"""``[custom.model]``: SANA-specific options cosmos-rl's ``[policy.diffusers]`` lacks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosmos_sana.config.base import StrictModel

Dtype = Literal["bfloat16", "float16", "float32"]


class ModelOptions(StrictModel):
    vae_dtype: Dtype = Field(default="float32", description="VAE precision (decode and encode)")
    text_encoder_dtype: Dtype | None = Field(
        default=None, description="text encoder precision; default: [policy.diffusers] dtype"
    )
    complex_human_instruction: Literal["off", "image", "video"] = Field(
        default="off",
        description="prefix prompts with SANA's complex-human-instruction (image or video wording), "
        "identically for rollout, training and export",
    )
    native_checkpoint: str | None = Field(
        default=None,
        description="native SANA transformer checkpoint (hf://org/repo/file, local .pth/.safetensors/"
        ".index.json); VAE, text encoder and tokenizer come from policy.model_name_or_path",
    )
    native_use_ema: bool = Field(default=False, description="load state_dict_ema from a native .pth")
    device: str | None = Field(
        default=None, description="device of the model (e.g. 'cpu'); default: the current accelerator, else cpu"
    )
    prompt_suffix: str = Field(
        default="", description="appended to every prompt before encoding (SANA-Video: ' motion score: 30.')"
    )
    fps: int = Field(default=16, ge=1, description="frame rate of generated and training videos")
    lora_data_parallel: Literal["fsdp", "replicate"] = Field(
        default="fsdp",
        description="how LoRA training places the transformer on the data-parallel ranks: 'fsdp' shards it "
        "with FSDP2 (cosmos-rl's way; every forward all-gathers the weights), 'replicate' keeps a whole "
        "copy on every rank and averages only the LoRA gradients, once per optimizer step (no all-gather; "
        "the model must fit one GPU; refused for full-parameter training)",
    )
    fsdp_gradient_sync: Literal["auto", "last_backward", "every_backward"] = Field(
        default="auto",
        description="when FSDP2 reduce-scatters gradients while a training step runs several backwards per "
        "optimizer step: 'last_backward' only in the last one (earlier backwards accumulate unsharded "
        "gradients: the whole trained parameters' gradient on every rank), 'every_backward' in each "
        "(cosmos-rl's way), 'auto' = 'last_backward' for LoRA and 'every_backward' for full-parameter "
        "training, whose unsharded gradients would be the whole model's",
    )
