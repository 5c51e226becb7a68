"""Each loss on small fixed tensors against values derived by hand (in the comments)."""

import math

import pytest
import torch

from cosmos_sana_plugins.trainers import losses as L

TOL = dict(rtol=0, atol=1e-6)


def close(actual, expected):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), **TOL)


def nft_case():
    # x0 = [1, 0], ε = [0, 1], σ = 0.5 → x_t = [0.5, 0.5]; two identical samples
    x0 = torch.tensor([[1.0, 0.0]] * 2)
    xt = torch.tensor([[0.5, 0.5]] * 2)
    sigma = torch.tensor([0.5, 0.5])
    v_theta = torch.tensor([[-1.0, 3.0]] * 2, requires_grad=True)
    v_old = torch.tensor([[-1.0, 2.0]] * 2)
    v_ref = torch.tensor([[-1.0, 1.0]] * 2)
    return x0, xt, sigma, v_theta, v_old, v_ref


def test_nft_terms_match_hand_derivation():
    x0, xt, sigma, v_theta, v_old, v_ref = nft_case()
    # A = 2.5 → r' = 2.5/5/2 + 0.5 = 0.75;  A = −10 → clipped to −5 → r' = 0
    r = L.nft_optimality(torch.tensor([2.5, -10.0]), adv_clip=5.0)
    close(r, [0.75, 0.0])
    terms = L.nft_loss(
        v_theta=v_theta, v_old=v_old, v_ref=v_ref, x0=x0, xt=xt, sigma=sigma,
        optimality=r, beta=0.5, adv_clip=5.0, kl_beta=0.01,
    )
    # β = 0.5: v⁺ = [-1, 2.5] → x0⁺ = [1, -0.75]; w⁺ = mean(0, .75) = .375; L⁺ = mean(0, .5625)/.375 = .75
    close(terms.weight_positive, [0.375, 0.375])
    close(terms.positive, [0.75, 0.75])
    # v⁻ = 1.5·v_old − 0.5·v_θ = [-1, 1.5] → x0⁻ = [1, -0.25]; w⁻ = .125; L⁻ = mean(0, .0625)/.125 = .25
    close(terms.weight_negative, [0.125, 0.125])
    close(terms.negative, [0.25, 0.25])
    # per sample (r'L⁺ + (1−r')L⁻)/β·5: (.5625 + .0625)/.5·5 = 6.25 and .25/.5·5 = 2.5 → mean 4.375
    close(terms.policy, 4.375)
    # KL: (v_θ − v_ref)² = [0, 4] → 2
    close(terms.kl, 2.0)
    close(terms.loss, 4.375 + 0.01 * 2.0)


def test_nft_weights_are_detached_and_kl_optional():
    x0, xt, sigma, v_theta, v_old, _ = nft_case()
    terms = L.nft_loss(
        v_theta=v_theta, v_old=v_old, v_ref=None, x0=x0, xt=xt, sigma=sigma,
        optimality=torch.tensor([1.0, 1.0]), beta=0.5, adv_clip=5.0, kl_beta=0.0,
    )
    close(terms.loss, 0.75 / 0.5 * 5)
    terms.loss.backward()
    # r' = 1: loss = mean_b 10·mean_d((x0⁺−x0)²)/w⁺, x0⁺ = xt − σ(β v_θ + …) → ∂/∂v_θ[1] = 10·(2·(−.75)/2)/.375·(−.25)/2
    expected = 10 * (2 * -0.75 / 2) / 0.375 * (-0.5 * 0.5) / 2
    close(v_theta.grad, [[0.0, expected]] * 2)


def test_weight_copy_decay_schedules():
    assert L.weight_copy_decay(123, 0) == 0.0
    close(L.weight_copy_decay(100, 1), 0.1)
    close(L.weight_copy_decay(600, 1), 0.5)
    assert L.weight_copy_decay(74, 2) == 0.0
    close(L.weight_copy_decay(175, 2), 0.75)
    close(L.weight_copy_decay(400, 2), 0.999)
    with pytest.raises(ValueError, match="weight_copy_decay_type"):
        L.weight_copy_decay(1, 3)


def test_grpo_clipped_ratio_both_sides():
    # ratio 1.5 and 0.5 with ε = 0.2, A = ±1:
    #  ρ=1.5, A=+1: max(−1.5, −1.2) = −1.2 (clipped)   ρ=1.5, A=−1: max(1.5, 1.2) = 1.5
    #  ρ=0.5, A=+1: max(−0.5, −0.8) = −0.5             ρ=0.5, A=−1: max(0.5, 0.8) = 0.8 (clipped)
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, ratio = L.grpo_clipped_loss(new, old, adv, 0.2, 0.2)
    close(ratio, [1.5, 1.5, 0.5, 0.5])
    close(loss, (-1.2 + 1.5 - 0.5 + 0.8) / 4)
    loss.backward()
    # clipped entries carry no gradient; unclipped: ∂(−Aρ)/∂logp /4 = −Aρ/4
    close(new.grad, [0.0, 1.5 / 4, -0.5 / 4, 0.0])


def test_sde_kl():
    # mean([1, 4]) / (2·.5²) = 5; std broadcasts per sample
    close(L.sde_kl(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2), torch.tensor([[0.5]])), [5.0])


def test_group_advantages_per_prompt_and_global_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 13.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    # population std (ddof 0, the papers' np.std): group 0 deviations −1, 0, 1 → var 2/3
    per_group = L.group_advantages(rewards, groups, global_std=False)
    s0 = math.sqrt(2 / 3) + 1e-4
    close(per_group[:3], [-1 / s0, 0.0, 1 / s0])
    s1 = math.sqrt(6 / 3) + 1e-4  # group 1: deviations −1, −1, 2 → var 6/3
    close(per_group[3:], [-1 / s1, -1 / s1, 2 / s1])
    # sample std (ddof 1): var 2/2 and 6/2
    sample = L.group_advantages(rewards, groups, global_std=False, ddof=1)
    close(sample, [-1 / 1.0001, 0.0, 1 / 1.0001] + [d / (math.sqrt(3.0) + 1e-4) for d in (-1, -1, 2)])
    # global: squares of deviations from 6.5 sum to 129.5 → std = sqrt(129.5/6)
    g = math.sqrt(129.5 / 6) + 1e-4
    close(L.group_advantages(rewards, groups, global_std=True), [-1 / g, 0, 1 / g, -1 / g, -1 / g, 2 / g])
    # a group of equal rewards, and a group of one, get advantage 0
    close(L.group_advantages(torch.tensor([4.0, 4.0, 7.0]), torch.tensor([0, 0, 1]), global_std=False), [0, 0, 0])


def test_negative_exp_advantage():
    close(L.negative_exp_advantage(torch.tensor([0.0, 1.0, -2.0])), [-1.0, -math.exp(-1.0), -math.exp(2.0)])


def test_kl_std_forms():
    # sde step σ 0.75 → 0.5: step std 0.2 = std_dev_t·sqrt(0.25) → flow_grpo divides by std_dev_t = 0.4
    step_std, sigma, sigma_next = torch.full((2, 1, 1), 0.2), torch.tensor([0.75, 0.75]), torch.tensor([0.5, 0.5])
    close(L.kl_std("flow_grpo", "sde", step_std, sigma, sigma_next).flatten(), [0.4, 0.4])
    close(L.kl_std("gaussian", "sde", step_std, sigma, sigma_next).flatten(), [0.2, 0.2])
    close(L.kl_std("flow_grpo", "cps", step_std, sigma, sigma_next).flatten(), [0.2, 0.2])  # cps: the step std
    with pytest.raises(ValueError, match="kl_form"):
        L.kl_std("reverse", "sde", step_std, sigma, sigma_next)
    with pytest.raises(ValueError, match="kl_form"):  # named for any sampler, not only where it matters
        L.kl_std("reverse", "cps", step_std, sigma, sigma_next)


def test_flow_matching_loss():
    # target ε − x0 = [−1, 1]; prediction 0 → mean(1, 1) = 1; prediction = target → 0
    x0, noise = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    close(L.flow_matching_loss(torch.zeros(1, 2), x0, noise), [1.0])
    close(L.flow_matching_loss(noise - x0, x0, noise), [0.0])
    close(L.noised(x0, noise, torch.tensor([0.25])), [[0.75, 0.25]])


def test_best_of_n_selection_and_rollout_batch():
    assert L.auto_rollout_batch_size(48, 24) == 24
    assert L.auto_rollout_batch_size(36, 24) == 18
    assert L.auto_rollout_batch_size(7, 24) == 7
    assert L.auto_rollout_batch_size(2, 24) == 2
    scores = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.7, 0.2])
    assert L.best_and_worst(scores, 4).tolist() == [1, 4, 5, 2]  # top two, bottom two
    assert L.best_and_worst(scores, 3).tolist() == [1, 4, 2]
    with pytest.raises(ValueError):
        L.best_and_worst(scores, 7)
