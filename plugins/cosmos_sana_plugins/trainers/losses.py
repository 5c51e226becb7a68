"""The algorithms' losses as pure tensor functions (no model, no config).

Conventions (SANA flow matching): ``x_σ = (1 − σ)·x0 + σ·ε``, the model predicts the
velocity ``v = ε − x0``, σ runs from 1 (noise) to 0 (data). Per-sample quantities are
means over every non-batch dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def mean_flat(x: Tensor) -> Tensor:
    """Mean over all dimensions but the first."""
    return x.mean(dim=tuple(range(1, x.ndim))) if x.ndim > 1 else x


def expand_like(per_sample: Tensor, ref: Tensor) -> Tensor:
    """``[B]`` → ``[B, 1, …, 1]`` broadcastable against ``ref``."""
    return per_sample.reshape(-1, *([1] * (ref.ndim - 1)))


# ------------------------------------------------------------------ flow matching


def noised(x0: Tensor, noise: Tensor, sigma: Tensor) -> Tensor:
    """x_σ = (1 − σ)·x0 + σ·ε."""
    s = expand_like(sigma, x0)
    return (1.0 - s) * x0 + s * noise


def flow_matching_loss(v_pred: Tensor, x0: Tensor, noise: Tensor) -> Tensor:
    """Per-sample ``mean((v_pred − (ε − x0))²)``; shape ``[B]``."""
    return mean_flat((v_pred.float() - (noise.float() - x0.float())) ** 2)


# ------------------------------------------------------------------ advantages


def group_advantages(
    rewards: Tensor, group_ids: Tensor, *, global_std: bool, ddof: int = 0, eps: float = 1e-4
) -> Tensor:
    """(r − mean of the sample's group) / (std + eps), as flow_grpo's ``PerPromptStatTracker``.

    The std is the group's, or the whole batch's when ``global_std``; ``ddof`` 0 is the
    population std (``np.std``, the papers' code), 1 the sample std (``torch.std``). A group
    whose rewards are all equal gets advantage 0. ``group_ids`` labels the samples of one prompt.
    """
    rewards = rewards.double()
    adv = torch.empty_like(rewards)
    batch_std = _std(rewards, ddof)
    for gid in torch.unique(group_ids):
        mask = group_ids == gid
        group = rewards[mask]
        std = batch_std if global_std else _std(group, ddof)
        adv[mask] = (group - group.mean()) / (std + eps)
    return adv.float()


def _std(values: Tensor, ddof: int) -> Tensor:
    """Std with ``ddof`` delta degrees of freedom; 0 when there are not more than ``ddof`` values."""
    if values.numel() <= ddof:
        return values.new_tensor(0.0)
    return values.std(correction=ddof)


def negative_exp_advantage(adv: Tensor) -> Tensor:
    """A → −exp(−A) (cosmos-rl's WFM DDRL ``exp_reward``): every sample is pushed down, the worse
    ones exponentially harder."""
    return -torch.exp(-adv)


# ------------------------------------------------------------------ Diffusion-NFT


def nft_optimality(adv: Tensor, adv_clip: float) -> Tensor:
    """r' = clamp(clamp(A, ±c)/c/2 + 0.5, 0, 1): advantage mapped to a probability of being "good"."""
    return (adv.clamp(-adv_clip, adv_clip) / adv_clip / 2.0 + 0.5).clamp(0.0, 1.0)


@dataclass
class NFTTerms:
    loss: Tensor
    policy: Tensor
    kl: Tensor
    positive: Tensor  # per-sample L⁺
    negative: Tensor  # per-sample L⁻
    weight_positive: Tensor  # per-sample w⁺
    weight_negative: Tensor  # per-sample w⁻


def _adaptive_x0_loss(x0_pred: Tensor, x0: Tensor) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        weight = mean_flat((x0_pred.double() - x0.double()).abs()).clamp(min=1e-5)
    loss = mean_flat((x0_pred - x0) ** 2 / expand_like(weight, x0).to(x0_pred.dtype))
    return loss, weight


def nft_loss(
    *,
    v_theta: Tensor,
    v_old: Tensor,
    v_ref: Tensor | None,
    x0: Tensor,
    xt: Tensor,
    sigma: Tensor,
    optimality: Tensor,
    beta: float,
    adv_clip: float,
    kl_beta: float,
) -> NFTTerms:
    """Diffusion-NFT: implicit positive/negative policies around the ``old`` one.

    v⁺ = β·v_θ + (1−β)·v_old, v⁻ = (1+β)·v_old − β·v_θ; x0± = x_t − σ·v±;
    L± = mean((x0± − x0)² / w±) with w± = mean|x0± − x0| (detached, ≥ 1e-5);
    policy = mean((r'·L⁺ + (1 − r')·L⁻) / β · c); loss = policy + kl_beta · mean((v_θ − v_ref)²).
    ``v_ref=None`` (or ``kl_beta=0``) drops the KL term.
    """
    v_old = v_old.detach()
    s = expand_like(sigma, x0).to(v_theta.dtype)
    v_pos = beta * v_theta + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    positive, w_pos = _adaptive_x0_loss(xt - s * v_pos, x0)
    negative, w_neg = _adaptive_x0_loss(xt - s * v_neg, x0)
    r = optimality.to(positive.dtype)
    policy = ((r * positive + (1.0 - r) * negative) / beta * adv_clip).mean()
    if v_ref is None or kl_beta == 0.0:
        kl = policy.new_zeros(())
    else:
        kl = mean_flat((v_theta - v_ref.detach()) ** 2).mean()
    return NFTTerms(policy + kl_beta * kl, policy, kl, positive, negative, w_pos, w_neg)


def weight_copy_decay(step: int, decay_type: int) -> float:
    """``old ← decay·old + (1 − decay)·new``; type 0: 0; 1: min(0.001·s, 0.5);
    2: 0 before step 75, then min(0.0075·(s − 75), 0.999)."""
    if decay_type == 0:
        return 0.0
    if decay_type == 1:
        return min(0.001 * step, 0.5)
    if decay_type == 2:
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    raise ValueError(f"policy.diffusers.weight_copy_decay_type must be 0, 1 or 2, got {decay_type}")


# ------------------------------------------------------------------ Flow-GRPO (step log-probs: sana.sampling)


def grpo_clipped_loss(log_prob: Tensor, old_log_prob: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """mean(max(−A·ρ, −A·clip(ρ, 1 − eps_low, 1 + eps_high))) with ρ = exp(log p − log p_old); returns (loss, ρ)."""
    ratio = torch.exp(log_prob - old_log_prob.detach())
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped).mean(), ratio


def sde_kl(mean_theta: Tensor, mean_ref: Tensor, std: Tensor) -> Tensor:
    """Per-sample mean((μ_θ − μ_ref)² / (2·std²)) over non-batch dims, ``std`` broadcastable;
    0 for a deterministic step (std 0). With the step's own std this is the KL of the two step
    Gaussians; :func:`kl_std` gives the std each KL form divides by."""
    safe = torch.where(std > 0, std, torch.ones_like(std))
    kl = (mean_theta - mean_ref.detach()) ** 2 / (2.0 * safe**2)
    return mean_flat(torch.where(std > 0, kl, torch.zeros_like(kl)))


def kl_std(form: str, sampler: str, step_std: Tensor, sigma: Tensor, sigma_next: Tensor) -> Tensor:
    """The std the Flow-GRPO KL divides by, broadcastable like ``step_std``.

    ``"gaussian"``: the step's std (exact KL of the two step Gaussians). ``"flow_grpo"``: the
    std_dev_t flow_grpo's ``sde_step_with_logprob`` returns and ``train_sd3.py`` divides by: for
    the ``sde`` sampler the step std without its sqrt(σ − σ') factor, for ``cps`` the step std
    itself (there the two forms agree).
    """
    if form not in ("flow_grpo", "gaussian"):
        raise ValueError(f"custom.trainer.kl_form must be 'flow_grpo' or 'gaussian', got {form!r}")
    if form == "gaussian" or sampler != "sde":
        return step_std
    step = (sigma.float() - sigma_next.float()).reshape(-1, *([1] * (step_std.ndim - 1)))
    return step_std / step.sqrt()


# ------------------------------------------------------------------ best-of-n


def auto_rollout_batch_size(n: int, cap: int = 24) -> int:
    """Largest divisor of ``n`` not above ``min(cap, n)`` (48 → 24, 36 → 18, 7 → 7 with cap 24)."""
    if n < 1 or cap < 1:
        raise ValueError(f"need n ≥ 1 and cap ≥ 1, got n={n}, cap={cap}")
    return max(d for d in range(1, min(cap, n) + 1) if n % d == 0)


def best_and_worst(scores: Tensor, keep: int) -> Tensor:
    """Indices of the ``ceil(keep/2)`` best and ``floor(keep/2)`` worst scores (best first, no repeats)."""
    n = scores.numel()
    if not 1 <= keep <= n:
        raise ValueError(f"keep must be in [1, {n}], got {keep}")
    order = torch.argsort(scores, descending=True, stable=True)
    top = (keep + 1) // 2
    return torch.cat([order[:top], order[n - (keep - top) :]]) if keep - top else order[:top]
