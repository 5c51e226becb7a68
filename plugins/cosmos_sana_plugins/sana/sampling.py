"""Flow-matching samplers with per-step Gaussian log-probabilities (images and videos).

Conventions: σ ∈ [0, 1] everywhere (σ = 1 pure noise, 0 clean), ``x_σ = (1−σ)·x0 + σ·ε``,
the model predicts the velocity ``v = ε − x0``; a step goes from σ to σ' < σ with
``dt = σ' − σ``. Latents and step arithmetic are float32.

Public API (σ arguments broadcast: a 0-d tensor or one value per sample)::

    sigma_grid(num_steps, *, shift=1.0, device=None) -> Tensor[num_steps + 1]   # 1 → 0
    shift_sigmas(sigmas, shift) -> Tensor                  # shift·σ / (1 + (shift−1)·σ)
    ode_step(velocity, latents, sigma, sigma_next) -> Tensor          # Euler
    step_distribution(kind, velocity, latents, sigma, sigma_next, eta) -> (mean, std)
    gaussian_log_prob(sample, mean, std) -> Tensor[B]     # mean over non-batch dims; 0 where std == 0
    step_log_prob(kind, velocity, latents, next_latents, sigma, sigma_next, eta) -> (log_prob, mean, std)
    generators_for(seeds, device) -> list[torch.Generator]
    draw_noise(generators, shape, num_steps, device) -> (initial [B, *shape], step_noise [B, N, *shape] | None)
    GuidedDenoiser(model, text, negative=None, guidance_scale=1.0)(latents, sigmas) -> velocity (CFG)
    denoise(denoiser, initial, sigmas, *, sampler="ode", eta=0.0, step_noise=None) -> Trajectory
    sample(model, text, generators, settings, *, negative=None) -> SampleOutput
    SamplerSettings(height, width, frames=1, num_steps=10, sampler="ode", eta=0.0, guidance_scale=1.0,
                    shift=1.0, decode=True)
    sampler_settings(cosmos_config, model, *, validation=False) -> SamplerSettings

Step kinds: ``ode`` deterministic Euler; ``sde`` Flow-GRPO
(std = sqrt(σ/(1−σ))·η·sqrt(−dt), mean = x(1 + s²dt/(2σ)) + v(1 + s²(1−σ)/(2σ))dt with
s = sqrt(σ/(1−σ))·η; at σ = 1 the denominator uses σ' as Flow-GRPO does); ``cps``
coefficient-preserving (std = σ'·sin(ηπ/2), mean = (1−σ')x̂0 + sqrt(σ'² − std²)x̂1 with
x̂0 = x − σv, x̂1 = x + (1−σ)v). With η = 0 both equal the Euler step. Log-probs are the
normalised Gaussian log-density of the taken step, averaged over non-batch dims; a
deterministic step (std 0) has log-prob 0.

Seeds: sample ``i`` draws its initial noise and every step noise from ``generators[i]`` alone,
up front, so a seed reproduces a sample exactly whatever else is in the batch.

The ``model`` argument is duck-typed (:class:`~cosmos_sana_plugins.sana.model.SanaModel`
fits): ``velocity(latents, sigmas, text)``, ``latent_shape(height, width, frames)``,
``negative_text(batch)``, ``decode_latents(latents)``, ``current_device()``, ``transformer``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from cosmos_sana_plugins.sana.text import TextConditioning

SamplerKind = Literal["ode", "sde", "cps"]
SAMPLERS: tuple[str, ...] = ("ode", "sde", "cps")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """SANA/SD3 time shift: ``shift·σ / (1 + (shift − 1)·σ)`` (shift 1 = identity)."""
    if shift <= 0:
        raise ValueError(f"flow shift must be > 0, got {shift}")
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def sigma_grid(num_steps: int, *, shift: float = 1.0, device: torch.device | str | None = None) -> torch.Tensor:
    """``num_steps + 1`` float32 σ values from 1 to 0, linear in σ then time-shifted."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    return shift_sigmas(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32, device=device), shift)


def _per_sample(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A 0-d or ``[B]`` tensor shaped to broadcast over ``like`` (``[B, ...]``)."""
    value = value.to(torch.float32)
    return value if value.ndim == 0 else value.reshape(value.shape[0], *([1] * (like.ndim - 1)))


def ode_step(
    velocity: torch.Tensor, latents: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor
) -> torch.Tensor:
    """Deterministic Euler step ``x + (σ' − σ)·v``."""
    dt = _per_sample(sigma_next, latents) - _per_sample(sigma, latents)
    return latents.float() + dt * velocity.float()


def step_distribution(
    kind: SamplerKind,
    velocity: torch.Tensor,
    latents: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    eta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (float32, like ``latents``) and std (broadcastable) of one stochastic step."""
    x, v = latents.float(), velocity.float()
    s, s_next = _per_sample(sigma, x), _per_sample(sigma_next, x)
    if kind == "sde":
        dt = s_next - s
        s_safe = torch.where(s >= 1, s_next, s)
        coef = torch.sqrt(s / (1 - s_safe)) * eta
        mean = x * (1 + coef**2 * dt / (2 * s)) + v * (1 + coef**2 * (1 - s) / (2 * s)) * dt
        return mean, coef * torch.sqrt(-dt)
    if kind == "cps":
        std = s_next * math.sin(eta * math.pi / 2)
        x0_hat, x1_hat = x - s * v, x + (1 - s) * v
        mean = (1 - s_next) * x0_hat + torch.sqrt((s_next**2 - std**2).clamp_min(0)) * x1_hat
        return mean, std
    if kind == "ode":
        return ode_step(v, x, sigma, sigma_next), torch.zeros_like(s)
    raise ValueError(f"sampler must be one of {SAMPLERS}, got {kind!r}")


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Per-sample mean over non-batch dims of log N(sample; mean, std²); 0 where std == 0."""
    std = std.to(torch.float32)
    positive = std > 0
    safe = torch.where(positive, std, torch.ones_like(std))
    density = -((sample.float() - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _LOG_SQRT_2PI
    density = torch.where(positive, density, torch.zeros_like(density))
    return density.mean(dim=tuple(range(1, density.ndim)))


def step_log_prob(
    kind: SamplerKind,
    velocity: torch.Tensor,
    latents: torch.Tensor,
    next_latents: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    eta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-prob of a recorded step ``latents → next_latents`` under ``velocity`` (differentiable in it)."""
    mean, std = step_distribution(kind, velocity, latents, sigma, sigma_next, eta)
    return gaussian_log_prob(next_latents.detach(), mean, std), mean, std


def generators_for(seeds: Sequence[int], device: torch.device | str) -> list[torch.Generator]:
    """One seeded ``torch.Generator`` per sample, on ``device``."""
    return [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]


def draw_noise(
    generators: Sequence[torch.Generator],
    shape: Sequence[int],
    num_steps: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Initial noise ``[B, *shape]`` and, if ``num_steps``, step noise ``[B, num_steps, *shape]``.

    Sample ``i`` uses ``generators[i]`` only: first the initial noise (as a diffusers
    pipeline draws it), then all step noises.
    """
    initial, steps = [], []
    for gen in generators:
        initial.append(torch.randn((1, *shape), generator=gen, device=gen.device, dtype=torch.float32))
        if num_steps:
            steps.append(torch.randn((1, num_steps, *shape), generator=gen, device=gen.device, dtype=torch.float32))
    step_noise = torch.cat(steps).to(device) if num_steps else None
    return torch.cat(initial).to(device), step_noise


class GuidedDenoiser:
    """``v(x, σ)`` for fixed text, with classifier-free guidance when ``guidance_scale > 1``.

    ``v = v_uncond + g·(v_cond − v_uncond)``, both halves in one batched forward. Used by the
    sampling loop and by trainers recomputing a step's log-prob (call it with grads on);
    ``detach_uncond`` stops the gradient at ``v_uncond`` (the value is unchanged).
    """

    def __init__(
        self,
        model: Any,
        text: TextConditioning,
        negative: TextConditioning | None = None,
        guidance_scale: float = 1.0,
        detach_uncond: bool = False,
    ) -> None:
        self.model = model
        self.guidance_scale = float(guidance_scale)
        self.detach_uncond = detach_uncond
        self.guided = self.guidance_scale > 1.0
        if self.guided:
            if negative is None:
                negative = model.negative_text(len(text))
            if negative.embeds.shape[1] != text.embeds.shape[1]:
                raise ValueError(
                    f"negative text length {negative.embeds.shape[1]} != prompt length {text.embeds.shape[1]}"
                )
            self.text = TextConditioning.cat([negative.to(text.embeds.device, text.embeds.dtype), text])
        else:
            self.text = text

    def __call__(self, latents: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
        batch = latents.shape[0]
        sigmas = sigmas.expand(batch) if sigmas.ndim == 0 else sigmas
        if not self.guided:
            return self.model.velocity(latents, sigmas, self.text)
        both = self.model.velocity(torch.cat([latents, latents]), torch.cat([sigmas, sigmas]), self.text)
        uncond, cond = both.chunk(2)
        if self.detach_uncond:
            uncond = uncond.detach()
        return uncond + self.guidance_scale * (cond - uncond)


@dataclass(frozen=True)
class Trajectory:
    """A sampled path. ``latents[:, 0]`` is the initial noise, ``latents[:, -1]`` the result.

    ``log_probs[:, i]`` and ``stds[i]`` describe the step ``latents[:, i] → latents[:, i+1]``
    from ``sigmas[i]`` to ``sigmas[i+1]`` (0 for deterministic steps); ``sampler`` and
    ``eta`` are what :func:`step_log_prob` needs to recompute them.
    """

    latents: torch.Tensor  # [B, N+1, *latent] float32
    sigmas: torch.Tensor  # [N+1] float32
    log_probs: torch.Tensor  # [B, N] float32
    stds: torch.Tensor  # [N] float32
    sampler: str
    eta: float


def denoise(
    denoiser: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    initial: torch.Tensor,
    sigmas: torch.Tensor,
    *,
    sampler: SamplerKind = "ode",
    eta: float = 0.0,
    step_noise: torch.Tensor | None = None,
) -> Trajectory:
    """Integrate from ``initial`` (at ``sigmas[0]``) along ``sigmas``; no host syncs in the loop."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    num_steps = sigmas.shape[0] - 1
    stochastic = sampler != "ode"
    if stochastic and (step_noise is None or step_noise.shape[:2] != (initial.shape[0], num_steps)):
        raise ValueError(f"sampler {sampler!r} needs step_noise of shape [B={initial.shape[0]}, N={num_steps}, ...]")
    batch = initial.shape[0]
    latents = torch.empty((batch, num_steps + 1, *initial.shape[1:]), dtype=torch.float32, device=initial.device)
    log_probs = torch.zeros((batch, num_steps), dtype=torch.float32, device=initial.device)
    stds = torch.zeros((num_steps,), dtype=torch.float32, device=initial.device)
    latents[:, 0] = initial
    x = latents[:, 0]
    for i in range(num_steps):
        velocity = denoiser(x, sigmas[i])
        if stochastic:
            mean, std = step_distribution(sampler, velocity, x, sigmas[i], sigmas[i + 1], eta)
            latents[:, i + 1] = mean + std * step_noise[:, i]
            log_probs[:, i] = gaussian_log_prob(latents[:, i + 1], mean, std)
            stds[i] = std
        else:
            latents[:, i + 1] = ode_step(velocity, x, sigmas[i], sigmas[i + 1])
        x = latents[:, i + 1]
    return Trajectory(latents, sigmas, log_probs, stds, sampler, float(eta))


@dataclass(frozen=True)
class SamplerSettings:
    """How to sample: media size, σ grid, step kind and guidance."""

    height: int
    width: int
    frames: int = 1
    num_steps: int = 10
    sampler: SamplerKind = "ode"
    eta: float = 0.0
    guidance_scale: float = 1.0
    shift: float = 1.0
    decode: bool = True


@dataclass(frozen=True)
class SampleOutput:
    latents: torch.Tensor  # final latents [B, *latent] float32
    trajectory: Trajectory
    media: torch.Tensor | None  # [B, C, H, W] or [B, T, C, H, W] in [0, 1]; None without decode


@torch.no_grad()
def sample(
    model: Any,
    text: TextConditioning,
    generators: Sequence[torch.Generator],
    settings: SamplerSettings,
    *,
    negative: TextConditioning | None = None,
) -> SampleOutput:
    """Generate one sample per row of ``text``, sample ``i`` seeded by ``generators[i]``.

    Uses whichever adapter is active on ``model`` (e.g. ``with model.adapter("old")``);
    the transformer runs in eval mode and is put back in its previous mode afterwards.
    """
    if len(generators) != len(text):
        raise ValueError(f"{len(generators)} generators for {len(text)} prompts: need one per sample")
    device = model.current_device()
    shape = model.latent_shape(settings.height, settings.width, settings.frames)
    sigmas = sigma_grid(settings.num_steps, shift=settings.shift, device=device)
    stochastic = settings.sampler != "ode"
    initial, step_noise = draw_noise(generators, shape, settings.num_steps if stochastic else 0, device)
    denoiser = GuidedDenoiser(model, text.to(device), negative, settings.guidance_scale)
    was_training = model.transformer.training
    model.transformer.eval()
    try:
        trajectory = denoise(
            denoiser, initial, sigmas, sampler=settings.sampler, eta=settings.eta, step_noise=step_noise
        )
    finally:
        model.transformer.train(was_training)
    final = trajectory.latents[:, -1]
    media = model.decode_latents(final) if settings.decode else None
    return SampleOutput(final, trajectory, media)


def sampler_settings(cosmos_config: Any, model: Any, *, validation: bool = False) -> SamplerSettings:
    """Settings from a cosmos-rl ``Config``: ``[policy.diffusers]`` (size, frames), its ``sample``
    table (steps, guidance, ``noise_level`` = η) and ``[custom.rollout]`` (sampler, σ schedule).

    Rollouts use ``train_frames`` and ``num_steps``; validation uses ``inference_frames``,
    ``eval_num_steps`` and the deterministic ODE sampler.
    """
    from cosmos_sana.config import RolloutOptions, wants_cosmos_sana
    from cosmos_sana.settings import settings_of

    diffusers_cfg = cosmos_config.policy.diffusers
    custom = getattr(cosmos_config, "custom", None) or {}
    rollout = settings_of(cosmos_config).rollout if wants_cosmos_sana({"custom": custom}) else RolloutOptions()
    size = list(diffusers_cfg.inference_size)
    if len(size) != 2:
        raise ValueError(f"policy.diffusers.inference_size must be [height, width], got {size}")
    frames_key = "inference_frames" if validation else "train_frames"
    frames = getattr(diffusers_cfg, frames_key) if model.is_video else 1
    try:
        model.latent_shape(size[0], size[1], frames)
    except ValueError as exc:
        raise ValueError(f"policy.diffusers.inference_size / {frames_key}: {exc}") from exc
    shift = 1.0
    if rollout.sigma_schedule == "shifted":
        shift = rollout.flow_shift if rollout.flow_shift is not None else model.default_flow_shift
    sample_cfg = diffusers_cfg.sample
    return SamplerSettings(
        height=size[0],
        width=size[1],
        frames=frames,
        num_steps=sample_cfg.eval_num_steps if validation else sample_cfg.num_steps,
        sampler="ode" if validation else rollout.sampler,
        eta=float(sample_cfg.noise_level),
        guidance_scale=float(sample_cfg.guidance_scale),
        shift=float(shift),
    )
