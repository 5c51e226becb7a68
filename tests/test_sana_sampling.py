"""σ grids, ODE/SDE/CPS steps and their log-probs, seeding and the denoising loop (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from cosmos_sana_plugins.sana import sampling
from cosmos_sana_plugins.sana.text import TextConditioning


def _normal_log_prob(x: torch.Tensor, mean: torch.Tensor, std: float) -> torch.Tensor:
    return torch.distributions.Normal(mean, std).log_prob(x).flatten(1).mean(1)


def test_sigma_grid_linear_and_shifted():
    assert sampling.sigma_grid(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    # shift 3: 3σ / (1 + 2σ): 0.75 → 2.25/2.5, 0.5 → 0.75, 0.25 → 0.5
    torch.testing.assert_close(sampling.sigma_grid(4, shift=3.0), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))
    with pytest.raises(ValueError, match="num_steps"):
        sampling.sigma_grid(0)


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_stochastic_step_with_zero_eta_is_the_euler_step(kind):
    x, v = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    sigma, sigma_next = torch.tensor(0.6), torch.tensor(0.35)
    mean, std = sampling.step_distribution(kind, v, x, sigma, sigma_next, eta=0.0)
    torch.testing.assert_close(mean, x - 0.25 * v)
    torch.testing.assert_close(sampling.ode_step(v, x, sigma, sigma_next), x - 0.25 * v)
    assert float(std) == 0.0
    log_prob, _, _ = sampling.step_log_prob(kind, v, x, mean, sigma, sigma_next, eta=0.0)
    assert log_prob.tolist() == [0.0, 0.0]  # a point mass has no density: defined as 0


def test_sde_step_mean_std_and_log_prob_by_hand():
    # σ = 0.5 → 0.25, η = 0.7: s = sqrt(0.5/0.5)·0.7 = 0.7, dt = −0.25, std = 0.7·0.5 = 0.35,
    # mean = x(1 + 0.49·(−0.25)/1) + v(1 + 0.49·0.5/1)(−0.25) = 0.8775x − 0.31125v
    x, v = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    mean, std = sampling.step_distribution("sde", v, x, torch.tensor(0.5), torch.tensor(0.25), eta=0.7)
    torch.testing.assert_close(mean, 0.8775 * x - 0.31125 * v)
    assert float(std) == pytest.approx(0.35)
    taken = mean + 0.35 * torch.randn_like(mean)
    log_prob, _, _ = sampling.step_log_prob("sde", v, x, taken, torch.tensor(0.5), torch.tensor(0.25), eta=0.7)
    torch.testing.assert_close(log_prob, _normal_log_prob(taken, mean, 0.35))
    assert log_prob.shape == (3,)


def test_sde_step_at_sigma_one_is_finite():
    # σ = 1 uses σ' in the denominator: s = sqrt(1/(1−0.75))·0.7 = 1.4, std = 1.4·sqrt(0.25) = 0.7
    x, v = torch.randn(2, 4), torch.randn(2, 4)
    mean, std = sampling.step_distribution("sde", v, x, torch.tensor(1.0), torch.tensor(0.75), eta=0.7)
    assert float(std) == pytest.approx(0.7)
    # mean = x(1 + 1.96·(−0.25)/2) + v(1 + 0)(−0.25)
    torch.testing.assert_close(mean, x * 0.755 - 0.25 * v)


def test_cps_log_prob_is_a_normalised_gaussian():
    # std = σ'·sin(ηπ/2); mean = (1−σ')(x − σv) + sqrt(σ'² − std²)(x + (1−σ)v)
    x, v = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    sigma, sigma_next, eta = 0.8, 0.4, 0.5
    std = sigma_next * math.sin(eta * math.pi / 2)
    expected_mean = (1 - sigma_next) * (x - sigma * v) + math.sqrt(sigma_next**2 - std**2) * (x + (1 - sigma) * v)
    mean, got_std = sampling.step_distribution("cps", v, x, torch.tensor(sigma), torch.tensor(sigma_next), eta)
    torch.testing.assert_close(mean, expected_mean)
    assert float(got_std) == pytest.approx(std)
    taken = mean + std * torch.randn_like(mean)
    log_prob, _, _ = sampling.step_log_prob("cps", v, x, taken, torch.tensor(sigma), torch.tensor(sigma_next), eta)
    torch.testing.assert_close(log_prob, _normal_log_prob(taken, mean, std))


def test_per_sample_sigmas_broadcast():
    x, v = torch.randn(2, 3), torch.randn(2, 3)
    both = sampling.ode_step(v, x, torch.tensor([0.5, 1.0]), torch.tensor([0.25, 0.5]))
    torch.testing.assert_close(both, torch.stack([x[0] - 0.25 * v[0], x[1] - 0.5 * v[1]]))


def test_noise_of_a_seed_does_not_depend_on_the_batch():
    alone_init, alone_steps = sampling.draw_noise(sampling.generators_for([5], "cpu"), (2, 3), 4, "cpu")
    batch_init, batch_steps = sampling.draw_noise(sampling.generators_for([9, 5, 7], "cpu"), (2, 3), 4, "cpu")
    assert torch.equal(batch_init[1], alone_init[0]) and torch.equal(batch_steps[1], alone_steps[0])
    assert batch_steps.shape == (3, 4, 2, 3)
    # the initial noise is what a diffusers pipeline draws from the same generator
    expected = torch.randn((1, 2, 3), generator=torch.Generator().manual_seed(5))
    assert torch.equal(alone_init, expected)


def test_euler_ode_reaches_the_data_point_of_an_exact_velocity():
    # For data concentrated at x0 the exact velocity is v(x, σ) = (x − x0)/σ; Euler then lands on x0.
    x0 = torch.randn(2, 3, 4)
    trajectory = sampling.denoise(lambda x, s: (x - x0) / s, torch.randn(2, 3, 4), sampling.sigma_grid(5))
    torch.testing.assert_close(trajectory.latents[:, -1], x0)
    assert trajectory.latents.shape == (2, 6, 3, 4) and trajectory.log_probs.abs().sum() == 0


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_recomputed_step_log_probs_match_the_rollout(kind):
    x0 = torch.randn(2, 3, 4)

    def denoiser(x, s):
        return (x - x0) / s.clamp_min(0.05)

    sigmas = sampling.sigma_grid(4, shift=3.0)
    initial, noise = sampling.draw_noise(sampling.generators_for([1, 2], "cpu"), (3, 4), 4, "cpu")
    traj = sampling.denoise(denoiser, initial, sigmas, sampler=kind, eta=0.7, step_noise=noise)
    for i in range(4):
        x = traj.latents[:, i]
        log_prob, _, std = sampling.step_log_prob(
            kind, denoiser(x, sigmas[i]), x, traj.latents[:, i + 1], sigmas[i], sigmas[i + 1], eta=0.7
        )
        torch.testing.assert_close(log_prob, traj.log_probs[:, i])
        assert float(std) == pytest.approx(float(traj.stds[i]))
    assert bool((traj.stds[:3] > 0).all())


def test_stochastic_denoise_needs_step_noise():
    with pytest.raises(ValueError, match="step_noise"):
        sampling.denoise(lambda x, s: x, torch.zeros(1, 2), sampling.sigma_grid(2), sampler="sde", eta=0.7)


class _FakeModel:
    """velocity = per-row mean of the text embedding (broadcast over the latent)."""

    def velocity(self, latents, sigmas, text):
        return text.embeds.mean(dim=(1, 2)).view(-1, 1) * torch.ones_like(latents) + sigmas.view(-1, 1)


def test_guided_denoiser_combines_both_halves():
    text = TextConditioning(torch.full((2, 3, 4), 2.0), torch.ones(2, 3, dtype=torch.long))
    negative = TextConditioning(torch.full((2, 3, 4), 0.5), torch.ones(2, 3, dtype=torch.long))
    guided = sampling.GuidedDenoiser(_FakeModel(), text, negative, guidance_scale=4.0)
    out = guided(torch.zeros(2, 5), torch.tensor(0.25))
    # (0.5 + 0.25) + 4·((2 + 0.25) − (0.5 + 0.25)) = 6.75
    torch.testing.assert_close(out, torch.full((2, 5), 6.75))
    unguided = sampling.GuidedDenoiser(_FakeModel(), text, negative, guidance_scale=1.0)
    torch.testing.assert_close(unguided(torch.zeros(2, 5), torch.tensor(0.25)), torch.full((2, 5), 2.25))
