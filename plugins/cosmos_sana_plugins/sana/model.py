"""The cosmos-rl model for SANA (``SanaPipeline``) and SANA-Video (``SanaVideoPipeline``) folders.

Built by cosmos-rl's ``ModelRegistry.build_model(config)`` through :meth:`SanaModel.from_pretrained`
(:func:`cosmos_sana.compat.cosmos_rl.register_models` registers it over upstream's ``SanaModel``). Reads ``[policy.diffusers]``
(dtype, offload, max_prompt_length, weighting_scheme, logit_mean/std, train_flow_shift),
``[policy.lora]`` (absent: full-parameter training) and ``[custom.model]``.

Public API (σ ∈ [0, 1] everywhere; the transformer's timestep is σ·num_train_timesteps,
times ``transformer.config.timestep_scale`` for images)::

    SanaModel.from_pretrained(cosmos_config, model_str, model_revision="main") -> SanaModel
    SanaModel(diffusers_config, lora_config=None, model_str="", model_revision="main", *, options=None)
    model.is_video, model.pipeline, model.transformer, model.vae, model.text_encoder, model.tokenizer
    model.current_device() -> torch.device
    # text (one encoding for rollout, training and inference; see text.py)
    model.encode_text(prompts) -> TextConditioning
    model.negative_text(batch_size) -> TextConditioning          # "" prompt, cached
    model.pipeline_call_kwargs() -> dict                         # same conditioning in a stock pipeline call
    # media (layouts: image [B, C, H, W], video [B, T, C, H, W], values in [0, 1])
    model.latent_shape(height, width, frames=1) -> tuple[int, ...]
    model.encode_media(media) -> latents (normalised, float32)
    model.decode_latents(latents) -> media in [0, 1] (float32)
    # transformer
    model.transformer_inputs(latents, sigmas, text) -> dict      # mask → encoder_attention_mask
    model.velocity(latents, sigmas, text) -> Tensor (float32)    # differentiable
    model.timesteps_of(sigmas) -> Tensor                         # σ·num_train_timesteps
    # training
    model.sample_training_sigmas(batch_size, *, device=None, generator=None) -> Tensor[B]
    model.add_noise(clean_latents, timestep=None, noise=None) -> (noisy, noise, sigmas)
    model.training_sft_step(clean_image, prompt_list, loss_only=True, x_t=None, timestep=None, noise=None)
    # LoRA (see lora.py)
    model.lora_names: list[str]; model.trainable_adapter: str | None; model.active_adapter: str | None
    model.use_adapter(name | None); with model.adapter(name | None): ...
    model.adapter_parameters(name) -> list[Parameter]
    model.blend_adapters(src, dst, decay)                        # dst ← decay·dst + (1−decay)·src
    # cosmos-rl DiffuserModel API: text_embedding, visual_embedding, set_scheduler_timestep,
    # nft_prepare_transformer_input, inference, trainable_params, trained_model, separate_model_parts

Sampling lives in sampling.py: ``sample(model, text, generators, settings)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from cosmos_rl.policy.model.diffusers import DiffuserModel

from cosmos_sana.config import ModelOptions, wants_cosmos_sana
from cosmos_sana.log import get_logger
from cosmos_sana_plugins.sana import lora as lora_utils
from cosmos_sana_plugins.sana.sampling import shift_sigmas
from cosmos_sana_plugins.sana.text import TextConditioning, encode_negative, encode_prompts, pipeline_call_kwargs
from cosmos_sana_plugins.trainers import losses

logger = get_logger(__name__)

PIPELINE_CLASSES = ("SanaPipeline", "SanaVideoPipeline")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_MODE_SCALE = 1.29  # diffusers' default for the "mode" timestep weighting


def resolve_device(name: str | None) -> torch.device:
    """``name``, else the current accelerator device (``torch.accelerator``), else CPU."""
    if name:
        return torch.device(name)
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def torch_dtype(name: str, key: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"{key} must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def model_options_of(cosmos_config: Any) -> ModelOptions:
    """``[custom.model]`` of a cosmos-sana recipe; defaults for a plain cosmos-rl TOML."""
    custom = getattr(cosmos_config, "custom", None) or {}
    if not wants_cosmos_sana({"custom": custom}):
        return ModelOptions()
    from cosmos_sana.settings import settings_of

    return settings_of(cosmos_config).model


def pipeline_class_name(model_str: str, revision: str = "main") -> str:
    from diffusers import DiffusionPipeline

    try:
        class_name = DiffusionPipeline.load_config(model_str, revision=revision)["_class_name"]
    except (OSError, KeyError) as exc:
        raise FileNotFoundError(f"{model_str}: no diffusers model_index.json with a _class_name ({exc})") from exc
    if class_name not in PIPELINE_CLASSES:
        raise ValueError(f"{model_str}/model_index.json: _class_name {class_name!r} is not one of {PIPELINE_CLASSES}")
    return class_name


class SanaModel(DiffuserModel):
    """One adapter for SANA images and SANA-Video (device- and dtype-agnostic)."""

    @staticmethod
    def supported_model_types() -> list[str]:
        return list(PIPELINE_CLASSES)

    def __init__(
        self,
        config: Any,
        lora_config: Any = None,
        model_str: str = "",
        model_revision: str = "main",
        *,
        options: ModelOptions | None = None,
    ) -> None:
        # Plain attributes the loader and apply_lora (called inside super().__init__) read.
        self.options = options or ModelOptions()
        self.lora_names: list[str] = []
        self.trainable_adapter: str | None = None
        self.active_adapter: str | None = None
        super().__init__(config, lora_config=lora_config, model_str=model_str, model_revision=model_revision)
        if lora_config is None:
            self.transformer.requires_grad_(True)
        self.tokenizers = [self.tokenizer]
        self._negative: TextConditioning | None = None

    @classmethod
    def from_pretrained(cls, config: Any, model_str: str, model_revision: str = "main") -> SanaModel:
        if getattr(config.policy.diffusers, "lora", None) is not None:
            raise ValueError("set LoRA options in [policy.lora]: cosmos-rl's diffusers trainers ignore "
                             "[policy.diffusers.lora]")
        return cls(
            config.policy.diffusers,
            lora_config=config.policy.lora,
            model_str=model_str,
            model_revision=model_revision or "main",
            options=model_options_of(config),
        )

    # ------------------------------------------------------------------ loading
    def load_models_from_hf(self, model_str: str, revision: str = "main") -> None:
        from diffusers import DiffusionPipeline

        self.model_str = model_str
        pipeline_class_name(model_str, revision)
        dtype = torch_dtype(self.config.dtype, "policy.diffusers.dtype")
        text_dtype_name = self.options.text_encoder_dtype or self.config.dtype
        text_dtype = torch_dtype(text_dtype_name, "custom.model.text_encoder_dtype")
        dtypes = {
            "transformer": dtype,
            "text_encoder": text_dtype,
            "vae": torch_dtype(self.options.vae_dtype, "custom.model.vae_dtype"),
            "default": dtype,
        }
        if self.options.native_checkpoint:  # the stock transformer would be loaded only to be replaced
            self.pipeline = DiffusionPipeline.from_pretrained(
                model_str, revision=revision, torch_dtype=dtypes, transformer=None
            )
            self._load_native_transformer(model_str, revision, dtype)
        else:
            self.pipeline = DiffusionPipeline.from_pretrained(model_str, revision=revision, torch_dtype=dtypes)
        device = resolve_device(self.options.device)
        self.valid_models = [k for k, v in self.pipeline.config.items() if isinstance(v, (tuple, list)) and v[0]]
        self.model_parts, self.offloaded_models = [], []
        for name in self.valid_models:
            part = getattr(self.pipeline, name)
            if isinstance(part, torch.nn.Module):
                offload = self.offload and name != "transformer"
                part.to(torch.device("cpu") if offload else device)
                if name != "transformer":
                    part.requires_grad_(False)
                if offload:
                    self.offloaded_models.append(part)
            setattr(self, name, part)
            self.model_parts.append((name, part))
        logger.info("loaded %s on %s (transformer %s, offload=%s)", model_str, device, dtype, self.offload)

    def _load_native_transformer(self, model_str: str, revision: str, dtype: torch.dtype) -> None:
        """The native checkpoint's weights in the architecture of the pipeline's ``transformer/config.json``."""
        import diffusers

        from cosmos_sana_plugins.sana.native_checkpoint import load_native_transformer

        class_name = diffusers.DiffusionPipeline.load_config(model_str, revision=revision)["transformer"][1]
        config = getattr(diffusers, class_name).load_config(model_str, subfolder="transformer", revision=revision)
        transformer = load_native_transformer(
            self.options.native_checkpoint,
            base_config=dict(config),
            use_ema=self.options.native_use_ema,
            torch_dtype=dtype,
        )
        self.pipeline.register_modules(transformer=transformer)

    @contextlib.contextmanager
    def _onloaded(self, *modules: torch.nn.Module) -> Iterator[None]:
        """Bring offloaded ``modules`` to the model's device for the block."""
        moved = [m for m in modules if any(m is o for o in self.offloaded_models)]
        device = self.current_device()
        for module in moved:
            module.to(device)
        try:
            yield
        finally:
            for module in moved:
                module.to("cpu")

    # ------------------------------------------------------------------ text
    @property
    def max_sequence_length(self) -> int:
        return self.config.max_prompt_length

    def encode_text(self, prompts: Sequence[str]) -> TextConditioning:
        """Prompts → conditioning on the model's device (CHI and suffix per ``[custom.model]``)."""
        with self._onloaded(self.text_encoder):
            return encode_prompts(
                self.pipeline,
                list(prompts),
                chi=self.options.complex_human_instruction,
                max_sequence_length=self.max_sequence_length,
                suffix=self.options.prompt_suffix,
                device=self.current_device(),
            )

    def negative_text(self, batch_size: int) -> TextConditioning:
        """The unconditional prompt, encoded once, expanded to ``batch_size`` rows."""
        device = self.current_device()
        if self._negative is None or self._negative.embeds.device != device:
            with self._onloaded(self.text_encoder):
                self._negative = encode_negative(
                    self.pipeline, 1, max_sequence_length=self.max_sequence_length, device=device
                )
        return TextConditioning(
            self._negative.embeds.expand(batch_size, -1, -1), self._negative.mask.expand(batch_size, -1)
        )

    def pipeline_call_kwargs(self) -> dict[str, Any]:
        """Stock-pipeline ``__call__`` arguments reproducing this conditioning (suffix: add to the prompt)."""
        return pipeline_call_kwargs(self.options.complex_human_instruction, self.max_sequence_length)

    def text_embedding(self, prompt_list: list[str], device: Any = None, **kwargs: Any) -> dict[str, Any]:
        """cosmos-rl API: ``{"encoder_hidden_states", "encoder_attention_mask", "pooled_projections"}``."""
        requested = kwargs.get("max_sequence_length", self.max_sequence_length)
        if requested != self.max_sequence_length:
            raise ValueError(f"max_sequence_length {requested} != policy.diffusers.max_prompt_length "
                             f"{self.max_sequence_length}")
        text = self.encode_text(prompt_list)
        if device is not None:
            text = text.to(device)
        return {"encoder_hidden_states": text.embeds, "encoder_attention_mask": text.mask, "pooled_projections": None}

    # ------------------------------------------------------------------ media
    def latent_shape(self, height: int, width: int, frames: int = 1) -> tuple[int, ...]:
        """Per-sample latent shape; ValueError when the size does not fit the VAE and patch grid."""
        channels = self.transformer.config.in_channels
        if not self.is_video:
            step = self.pipeline.vae_scale_factor * self.transformer.config.patch_size
            if height % step or width % step:
                raise ValueError(f"image size {height}x{width} must be a multiple of {step}")
            factor = self.pipeline.vae_scale_factor
            return (channels, height // factor, width // factor)
        spatial, temporal = self.pipeline.vae_scale_factor_spatial, self.pipeline.vae_scale_factor_temporal
        patch_t, patch_h, patch_w = self.transformer.config.patch_size
        if height % (spatial * patch_h) or width % (spatial * patch_w):
            grid = f"{spatial * patch_h}x{spatial * patch_w}"
            raise ValueError(f"video size {height}x{width} must be a multiple of {grid}")
        if frames < 1 or (frames - 1) % temporal:
            raise ValueError(f"video frames {frames} must be {temporal}·k + 1")
        latent_frames = (frames - 1) // temporal + 1
        if latent_frames % patch_t:
            raise ValueError(f"video frames {frames} give {latent_frames} latent frames, not a multiple of {patch_t}")
        return (channels, latent_frames, height // spatial, width // spatial)

    def _wan_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, self.vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean, dtype=torch.float32, device=like.device).view(shape)
        std = torch.tensor(self.vae.config.latents_std, dtype=torch.float32, device=like.device).view(shape)
        return mean, std

    @torch.no_grad()
    def encode_media(self, media: torch.Tensor) -> torch.Tensor:
        """Media in [0, 1] (image ``B C H W``, video ``B T C H W``) → normalised float32 latents."""
        expected = 5 if self.is_video else 4
        if media.ndim != expected:
            raise ValueError(f"expected {expected}-d media ({'B T C H W' if self.is_video else 'B C H W'}), "
                             f"got shape {tuple(media.shape)}")
        pixels = media * 2 - 1
        with self._onloaded(self.vae):
            pixels = pixels.to(self.vae.device, self.vae.dtype)
            if self.is_video:
                posterior = self.vae.encode(pixels.permute(0, 2, 1, 3, 4)).latent_dist
                latents = posterior.mean.float()
                mean, std = self._wan_stats(latents)
                latents = (latents - mean) / std
            else:
                latents = self.vae.encode(pixels).latent.float() * self.vae.config.scaling_factor
        return latents.to(self.current_device())

    def visual_embedding(self, input_visual_list: Any, height: Any = None, width: Any = None, device: Any = None):
        """cosmos-rl API: a list (or batch) of ``[-1, 1]`` ``C H W`` / ``C T H W`` tensors → latents."""
        batch = torch.stack(list(input_visual_list)) if not torch.is_tensor(input_visual_list) else input_visual_list
        media = (batch.float() + 1) / 2
        if self.is_video:
            media = media.permute(0, 2, 1, 3, 4)
        latents = self.encode_media(media)
        return latents.to(device) if device is not None else latents

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents → float32 media in [0, 1] (image ``B C H W``, video ``B T C H W``)."""
        with self._onloaded(self.vae):
            latents = latents.to(self.vae.device, torch.float32)
            if self.is_video:
                mean, std = self._wan_stats(latents)
                video = self.vae.decode((latents * std + mean).to(self.vae.dtype), return_dict=False)[0]
                media = self.pipeline.video_processor.postprocess_video(video.float(), output_type="pt")
            else:
                scaled = (latents / self.vae.config.scaling_factor).to(self.vae.dtype)
                image = self.vae.decode(scaled, return_dict=False)[0]
                media = self.pipeline.image_processor.postprocess(image.float(), output_type="pt")
        return media.to(self.current_device())

    # ------------------------------------------------------------------ transformer
    @property
    def num_train_timesteps(self) -> int:
        return self.scheduler.config.num_train_timesteps

    @property
    def timestep_scale(self) -> float:
        """SANA images scale the timestep by ``transformer.config.timestep_scale``; SANA-Video does not."""
        return 1.0 if self.is_video else float(getattr(self.transformer.config, "timestep_scale", 1.0))

    @property
    def default_flow_shift(self) -> float:
        """The pipeline scheduler's flow shift (DPM-Solver ``flow_shift`` or flow-match ``shift``)."""
        cfg = self.scheduler.config
        return float(cfg.get("flow_shift", None) or cfg.get("shift", None) or 1.0)

    def timesteps_of(self, sigmas: torch.Tensor) -> torch.Tensor:
        return sigmas * self.num_train_timesteps

    def transformer_inputs(
        self, latents: torch.Tensor, sigmas: torch.Tensor, text: TextConditioning
    ) -> dict[str, Any]:
        """Keyword arguments for ``self.transformer``: text mask as ``encoder_attention_mask``,
        timestep = σ·num_train_timesteps·timestep_scale (``sigmas``: 0-d or one per sample)."""
        dtype = next(self.transformer.parameters()).dtype  # diffusers' .dtype walks every module
        if sigmas.ndim == 0:
            sigmas = sigmas.expand(latents.shape[0])
        return {
            "hidden_states": latents.to(dtype),
            "timestep": self.timesteps_of(sigmas.float()) * self.timestep_scale,
            **text.as_transformer_kwargs(dtype),
            "return_dict": False,
        }

    def velocity(self, latents: torch.Tensor, sigmas: torch.Tensor, text: TextConditioning) -> torch.Tensor:
        """The transformer's velocity prediction ``ε − x0`` (float32; differentiable)."""
        return self.transformer(**self.transformer_inputs(latents, sigmas, text))[0].float()

    # ------------------------------------------------------------------ training
    def sample_training_sigmas(
        self, batch_size: int, *, device: Any = None, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """σ per sample: ``[policy.diffusers] weighting_scheme`` (logit_mean/std), shifted by ``train_flow_shift``."""
        from diffusers.training_utils import compute_density_for_timestep_sampling

        device = device if device is not None else (generator.device if generator is not None else "cpu")
        u = compute_density_for_timestep_sampling(
            weighting_scheme=self.config.weighting_scheme,
            batch_size=batch_size,
            logit_mean=self.config.logit_mean,
            logit_std=self.config.logit_std,
            mode_scale=_MODE_SCALE,
            device=device,
            generator=generator,
        )
        return shift_sigmas(u.float(), self.config.train_flow_shift).to(self.current_device())

    def add_noise(
        self, clean_latents: torch.Tensor, timestep: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x_σ = (1−σ)·x0 + σ·ε``; ``timestep`` here is σ ∈ [0, 1] per sample (sampled when None).

        Returns ``(noisy, noise, sigmas)``.
        """
        x0 = clean_latents.float()
        sigmas = self.sample_training_sigmas(x0.shape[0]) if timestep is None else timestep.float()
        noise = torch.randn_like(x0) if noise is None else noise.float()
        return losses.noised(x0, noise, sigmas.to(x0.device)), noise, sigmas

    def training_sft_step(
        self,
        clean_image: Any,
        prompt_list: list[str],
        loss_only: bool = True,
        x_t: torch.Tensor | None = None,
        timestep: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Flow-matching loss per sample, ``mean((ε − x0 − v_θ(x_σ, σ))²)``; inputs as upstream's."""
        latents = self.visual_embedding(clean_image)
        text = self.encode_text(prompt_list)
        noisy, noise, sigmas = self.add_noise(latents, timestep=timestep, noise=noise)
        if x_t is not None:
            noisy = x_t
        self.transformer.train()
        prediction = self.velocity(noisy, sigmas, text)
        loss = losses.flow_matching_loss(prediction, latents, noise)
        if loss_only:
            return {"loss": loss}
        return {"loss": loss, "x_t": noisy, "text": text, "visual_embedding": latents, "output": prediction}

    # ------------------------------------------------------------------ LoRA
    def apply_lora(self, lora_config: Any) -> None:
        """Add the ``[policy.lora]`` adapters (optionally starting from ``lora_path``); the primary one trains."""
        self.lora_names = lora_utils.add_adapters(self.transformer, lora_config)
        self.trainable_adapter = lora_utils.primary_adapter(lora_config)
        if lora_config.lora_path:
            lora_utils.load_adapter_weights(self.transformer, lora_config.lora_path, self.lora_names, lora_config)
        self.use_adapter(self.trainable_adapter)

    def use_adapter(self, name: str | None) -> None:
        """Forward with adapter ``name`` (None: the base model); only the trainable adapter needs grad."""
        if not self.lora_names:
            if name is not None:
                raise ValueError(f"no LoRA adapters (full-parameter model); cannot use adapter {name!r}")
            return
        if name is not None and name not in self.lora_names:
            raise ValueError(f"unknown adapter {name!r}; adapters are {self.lora_names}")
        lora_utils.activate(self.transformer, name, self.trainable_adapter)
        self.active_adapter = name

    @contextlib.contextmanager
    def adapter(self, name: str | None) -> Iterator[None]:
        """Temporarily forward with adapter ``name`` (None: base model, e.g. the KL reference)."""
        previous = self.active_adapter
        self.use_adapter(name)
        try:
            yield
        finally:
            self.use_adapter(previous)

    def adapter_parameters(self, name: str) -> list[torch.nn.Parameter]:
        return list(lora_utils.adapter_parameters(self.transformer, name).values())

    def blend_adapters(self, src: str, dst: str, decay: float) -> None:
        lora_utils.blend_adapter(self.transformer, src, dst, decay)

    # ------------------------------------------------------------------ cosmos-rl API
    def set_scheduler_timestep(self, timestep: int) -> None:
        """cosmos-rl API; sampling here does not use the pipeline scheduler's timesteps."""
        self.scheduler.set_timesteps(num_inference_steps=timestep, device=self.current_device())

    def nft_prepare_transformer_input(
        self,
        latents: torch.Tensor,
        prompt_embeds: torch.Tensor,
        prompt_attention_mask: torch.Tensor | None,
        pooled_prompt_embeds: Any,
        timestep: torch.Tensor,
        num_frames: Any = None,
        height: Any = None,
        width: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """cosmos-rl NFT API (``timestep`` in [0, num_train_timesteps]) with the mask reaching cross-attention."""
        mask = prompt_attention_mask
        if mask is None:
            mask = torch.ones(prompt_embeds.shape[:2], dtype=torch.long, device=prompt_embeds.device)
        text = TextConditioning(prompt_embeds, mask)
        return self.transformer_inputs(latents, timestep.float() / self.num_train_timesteps, text)

    @torch.no_grad()
    def inference(
        self,
        inference_step: int,
        height: int,
        width: int,
        prompt_list: list[str],
        guidance_scale: float,
        save_dir: str = "",
        frames: int | None = None,
        negative_prompt: str = "",
        output_type: str = "pil",
    ) -> Any:
        """cosmos-rl API: the stock pipeline (its own scheduler) on this adapter's text encoding."""
        text = self.encode_text(prompt_list)
        with self._onloaded(self.text_encoder):
            negative = encode_prompts(
                self.pipeline,
                [negative_prompt] * len(prompt_list),
                max_sequence_length=self.max_sequence_length,
                device=self.current_device(),
            )
        kwargs: dict[str, Any] = {"frames": frames} if self.is_video and frames is not None else {}
        was_training = self.transformer.training
        self.transformer.eval()
        try:
            with self._onloaded(*self.offloaded_models):
                output = self.pipeline(
                    negative_prompt=None,
                    prompt_embeds=text.embeds,
                    prompt_attention_mask=text.mask,
                    negative_prompt_embeds=negative.embeds,
                    negative_prompt_attention_mask=negative.mask,
                    height=height,
                    width=width,
                    guidance_scale=guidance_scale,
                    num_inference_steps=inference_step,
                    output_type=output_type,
                    use_resolution_binning=False,
                    **kwargs,
                )[0]
        finally:
            self.transformer.train(was_training)
        return output
