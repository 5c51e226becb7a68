"""Cheap per-sample image statistics that flag the usual reward hacks of RL on diffusion models.

Reward models are known to be gamed with over-saturated colours, grid / tiling patterns,
high-frequency noise and blank images. These statistics are computed on the media the
rewards score (``B×C×H×W`` images or ``B×T×C×H×W`` videos, values in [0, 1], C = 3 RGB or 1
grey), deterministically, in float32. A video's value is the mean over its frames.

* **luminance** ``Y = 0.299 R + 0.587 G + 0.114 B`` (ITU-R BT.601 luma; a 1-channel image is its own Y).
* **saturation**: the HSV saturation ``(max − min) / max`` over the channels of each pixel
  (0 where ``max = 0``), averaged over the pixels. Fully saturated red = 1, any grey = 0.
* **high_freq**: on the central ``SPECTRAL_CROP × SPECTRAL_CROP`` window (the whole image when
  smaller) the luminance minus its mean ``D``, its power spectrum ``P = |FFT2(D)|²`` (circular:
  the window's opposite edges count as neighbours), and the share of ``ΣP`` at radial frequencies
  ``sqrt(fx² + fy²) > 0.25`` cycles/pixel, i.e. above half the Nyquist frequency. A one-pixel
  checkerboard = 1, white noise ≈ 1 − π/16 ≈ 0.80, smooth images ≈ 0.
* **periodicity**: on the same window, per axis: every line (row for x, column for y) minus its own
  mean (which removes whatever is constant along that axis: lines across it, gradients along the
  other axis), the circular autocorrelation along the axis pooled over the lines,
  ``a(k) = Σ d(i)·d(i+k) / Σ d²`` for ``k = 1 … size/2``, and its highest value after it first
  drops to ≤ 0 (so the central lobe, high for any smooth content, is excluded). The larger of the
  two axes, floored at 0. A pattern repeating every ``p ≤ size/2`` pixels along rows or columns
  (stripes, grids, tiles) scores ≈ 1 (exactly 1 when ``p`` divides the window); white noise ≈ 0.01
  on a 256² window (more on smaller ones), gradients and single edges 0. Longer periods are not seen.
* **near_constant**: 1 when the luminance's population standard deviation over the whole sample
  (every pixel, every frame) is below ``near_constant_std``, else 0.

A window (for periodicity: an axis) whose luminance variance is below ``1e-10`` (flat) scores 0
on ``high_freq`` (``periodicity``).
"""

from __future__ import annotations

import torch

SPECTRAL_CROP = 256  # side of the central window of the spectral statistics (pixels)
FLAT_VARIANCE = 1e-10  # below this window variance the spectral statistics are 0
_LUMA = (0.299, 0.587, 0.114)
STATISTICS = ("saturation", "high_freq", "periodicity", "near_constant")


def as_frames(media: torch.Tensor) -> torch.Tensor:
    """``B×C×H×W`` or ``B×T×C×H×W`` → ``B×T×C×H×W`` (T = 1 for images)."""
    frames = media.unsqueeze(1) if media.ndim == 4 else media
    if frames.ndim != 5 or frames.shape[2] not in (1, 3):
        raise ValueError(
            f"image statistics need B×C×H×W or B×T×C×H×W media with 1 or 3 channels, got shape {tuple(media.shape)}"
        )
    return frames.detach()


def luminance(frames: torch.Tensor) -> torch.Tensor:
    """``…×C×H×W`` → ``…×H×W`` BT.601 luma."""
    if frames.shape[-3] == 1:
        return frames[..., 0, :, :]
    weights = torch.tensor(_LUMA, dtype=frames.dtype, device=frames.device)
    return torch.einsum("...chw,c->...hw", frames, weights)


def saturation(frames: torch.Tensor) -> torch.Tensor:
    """Mean HSV saturation per frame (``…×C×H×W`` → ``…``)."""
    high = frames.amax(dim=-3)
    low = frames.amin(dim=-3)
    per_pixel = torch.where(high > 0, (high - low) / high.clamp_min(torch.finfo(high.dtype).tiny), 0.0)
    return per_pixel.mean(dim=(-2, -1))


def central_crop(y: torch.Tensor, size: int = SPECTRAL_CROP) -> torch.Tensor:
    """The central ``min(H, size) × min(W, size)`` window of ``…×H×W``."""
    h, w = y.shape[-2:]
    ch, cw = min(h, size), min(w, size)
    top, left = (h - ch) // 2, (w - cw) // 2
    return y[..., top : top + ch, left : left + cw]


def _power_spectrum(window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(|FFT2(D)|², flat)`` with ``D`` the window minus its mean; ``flat`` marks variance < FLAT_VARIANCE."""
    centered = window - window.mean(dim=(-2, -1), keepdim=True)
    flat = centered.square().mean(dim=(-2, -1)) < FLAT_VARIANCE
    return torch.fft.fft2(centered).abs().square(), flat


def high_freq(power: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Share of the spectral energy above half Nyquist (radial frequency > 0.25 cycles/pixel)."""
    h, w = power.shape[-2:]
    fy = torch.fft.fftfreq(h, device=power.device)[:, None]
    fx = torch.fft.fftfreq(w, device=power.device)[None, :]
    high = (fy.square() + fx.square()) > 0.25**2
    total = power.sum(dim=(-2, -1))
    share = (power * high).sum(dim=(-2, -1)) / total.clamp_min(torch.finfo(total.dtype).tiny)
    return torch.where(flat, 0.0, share)


def _beyond_first_lobe(profile: torch.Tensor) -> torch.Tensor:
    """Max of ``profile[..., k]`` after its first value ≤ 0 (the lobe around lag 0 excluded), floored at 0."""
    past_lobe = torch.cummax((profile <= 0).to(torch.uint8), dim=-1).values.bool()
    return torch.where(past_lobe, profile, 0.0).amax(dim=-1).clamp_min(0.0)


def _row_periodicity(window: torch.Tensor) -> torch.Tensor:
    """Periodicity along the last axis of ``…×H×W``: rows centred, autocorrelation pooled over rows."""
    rows = window - window.mean(dim=-1, keepdim=True)
    power = torch.fft.rfft(rows, dim=-1).abs().square().sum(dim=-2)
    acf = torch.fft.irfft(power, n=rows.shape[-1], dim=-1)
    flat = rows.square().mean(dim=(-2, -1)) < FLAT_VARIANCE
    profile = acf[..., 1 : rows.shape[-1] // 2 + 1] / acf[..., :1].clamp_min(torch.finfo(acf.dtype).tiny)
    return torch.where(flat, 0.0, _beyond_first_lobe(profile))


def periodicity(window: torch.Tensor) -> torch.Tensor:
    """The strongest repeat along rows or columns of ``…×H×W``, past the autocorrelation's central lobe."""
    return torch.maximum(_row_periodicity(window), _row_periodicity(window.transpose(-2, -1)))


def _sample_statistics(frames: torch.Tensor, near_constant_std: float) -> list[torch.Tensor]:
    """One sample's statistics (``T×C×H×W`` → scalars, in :data:`STATISTICS` order)."""
    frames = frames.float()
    y = luminance(frames)  # T×H×W
    window = central_crop(y)
    power, flat = _power_spectrum(window)
    return [
        saturation(frames).mean(),
        high_freq(power, flat).mean(),
        periodicity(window).mean(),
        (y.std(unbiased=False) < near_constant_std).float(),
    ]


def image_statistics(media: torch.Tensor, near_constant_std: float) -> dict[str, torch.Tensor]:
    """Per-sample ``{statistic: [B]}`` for every name in :data:`STATISTICS` (definitions: module docstring).

    One sample at a time, so the temporaries stay those of one sample (a long video is large)."""
    frames = as_frames(media)
    per_sample = torch.stack([torch.stack(_sample_statistics(sample, near_constant_std)) for sample in frames])
    return dict(zip(STATISTICS, per_sample.unbind(1)))
