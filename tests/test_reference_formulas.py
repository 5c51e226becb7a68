"""Our trainers' ``loss_terms`` and advantages against the reference implementations' formulas.

Each ``ref_*`` function is written from the named function of the papers' code (the formulas,
not the code), and is compared on identical tensors with what our trainers compute: the loss
and its gradient, through a small stand-in velocity model with LoRA-style adapters in float64
(Diffusion-NFT and the advantages to 1e-6; Flow-GRPO's SDE step runs in float32 on both sides,
as flow_grpo's does, so Flow-GRPO and DDRL agree to 1e-5 relative), and Flow-GRPO and Diffusion-NFT
once more through the tiny SANA transformer (PEFT LoRA) in float32, to 1e-5 relative.

References:
* flow_grpo = yifan123/flow_grpo (commit ac4c86e): ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``
  ``sde_step_with_logprob``; ``scripts/train_sd3.py`` ``compute_log_prob`` and the GRPO loss in ``main``;
  ``flow_grpo/stat_tracking.py`` ``PerPromptStatTracker.update``.
* DiffusionNFT = NVlabs/DiffusionNFT (commit 24af555): ``scripts/train_nft_sd3.py``, the loss in ``main``.
* cosmos-rl 0.4.7: ``cosmos_rl/policy/trainer/wfm_trainer.py`` ``rl_training_step`` (DDRL: ``exp_reward``,
  the advantage clip, ``policy_loss + kl_beta·kl_loss + data_beta·data_loss``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_trainers import brightness, build_rollout, build_trainer, recipe, scored_rollouts

from cosmos_sana.settings import settings_of
from cosmos_sana_plugins.sana import lora as lora_utils
from cosmos_sana_plugins.sana.sampling import GuidedDenoiser, denoise, sigma_grid
from cosmos_sana_plugins.sana.text import TextConditioning
from cosmos_sana_plugins.trainers.ddrl import SanaDDRLTrainer
from cosmos_sana_plugins.trainers.grpo import SanaFlowGRPOTrainer
from cosmos_sana_plugins.trainers.nft import SanaNFTTrainer
from cosmos_sana_plugins.trainers.policies import RLPolicies
from cosmos_sana_plugins.trainers.rl import RolloutBatch

FP64_ATOL = 1e-6
FP32_RTOL = 1e-5
CLIP = 0.025  # ratio clip ε: some of the test ratios fall outside 1 ± ε, some inside
LATENT = (2, 2, 2)  # C, H, W of the stand-in's latents
TEXT_LEN, TEXT_DIM = 3, 4


# ============================================================== reference formulas


def ref_flow_grpo_velocity(model, x, sigma, text, negative, guidance: float, detach_uncond: bool):
    """flow_grpo ``scripts/train_sd3.py`` ``compute_log_prob``: with CFG one forward of [x, x] on
    [negative, prompt], v = v_u + g·(v_c − v_u); its July 2025 versions detach v_u, the others do not."""
    if guidance <= 1.0:
        return model.velocity(x, sigma, text)
    both = model.velocity(torch.cat([x, x]), torch.cat([sigma, sigma]), TextConditioning.cat([negative, text]))
    uncond, cond = both.chunk(2)
    if detach_uncond:
        uncond = uncond.detach()
    return uncond + guidance * (cond - uncond)


def ref_sde_step_with_logprob(v, x, x_next, sigma, sigma_next, sigma_max: float, eta: float):
    """flow_grpo ``sd3_sde_with_logprob.py`` ``sde_step_with_logprob`` (fp32): returns
    (log_prob averaged over non-batch dims, prev_sample_mean, std_dev_t)."""
    v, x, x_next = v.float(), x.float(), x_next.float()
    shape = (-1,) + (1,) * (x.ndim - 1)
    s, s_next = sigma.float().view(shape), sigma_next.float().view(shape)
    dt = s_next - s
    std_dev_t = torch.sqrt(s / (1 - torch.where(s == 1, torch.full_like(s, sigma_max), s))) * eta
    mean = x * (1 + std_dev_t**2 / (2 * s) * dt) + v * (1 + std_dev_t**2 * (1 - s) / (2 * s)) * dt
    step_std = std_dev_t * torch.sqrt(-dt)
    log_prob = -((x_next - mean) ** 2) / (2 * step_std**2) - torch.log(step_std) - math.log(math.sqrt(2 * math.pi))
    return log_prob.mean(dim=tuple(range(1, x.ndim))), mean, std_dev_t


def ref_flow_grpo_loss(log_prob, old_log_prob, adv, *, clip_range, adv_clip_max, beta, mean, mean_ref, std_dev_t):
    """flow_grpo ``scripts/train_sd3.py`` ``main``: clamped advantages, clipped ratio, and
    KL = mean over the batch of mean_dims((μ − μ_ref)²) / (2·std_dev_t²). Returns (loss, policy, kl)."""
    adv = torch.clamp(adv, -adv_clip_max, adv_clip_max)
    ratio = torch.exp(log_prob - old_log_prob)
    policy = torch.mean(torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)))
    kl = ((mean - mean_ref) ** 2).mean(dim=tuple(range(1, mean.ndim)), keepdim=True) / (2 * std_dev_t**2)
    kl = torch.mean(kl)
    return policy + beta * kl, policy, kl


def ref_nft_loss(v_theta, v_old, v_ref, x0, xt, t, adv, *, beta, adv_clip_max, kl_beta):
    """DiffusionNFT ``scripts/train_nft_sd3.py`` ``main``: implicit positive/negative policies,
    detached adaptive weights (float64, ≥ 1e-5), r = clamp(A/c/2 + 0.5, 0, 1), KL on v."""
    dims = tuple(range(1, x0.ndim))
    t = t.view(-1, *([1] * (x0.ndim - 1)))
    r = torch.clamp(torch.clamp(adv, -adv_clip_max, adv_clip_max) / adv_clip_max / 2.0 + 0.5, 0, 1)
    positive = beta * v_theta + (1 - beta) * v_old.detach()
    negative = (1.0 + beta) * v_old.detach() - beta * v_theta
    x0_pos, x0_neg = xt - t * positive, xt - t * negative
    with torch.no_grad():
        w_pos = torch.abs(x0_pos.double() - x0.double()).mean(dim=dims, keepdim=True).clip(min=0.00001)
        w_neg = torch.abs(x0_neg.double() - x0.double()).mean(dim=dims, keepdim=True).clip(min=0.00001)
    positive_loss = ((x0_pos - x0) ** 2 / w_pos).mean(dim=dims)
    negative_loss = ((x0_neg - x0) ** 2 / w_neg).mean(dim=dims)
    policy = ((r * positive_loss / beta + (1.0 - r) * negative_loss / beta) * adv_clip_max).mean()
    kl = torch.mean(((v_theta - v_ref) ** 2).mean(dim=dims))
    return policy + kl_beta * kl, policy, kl


def ref_per_prompt_advantages(prompts: list[str], rewards: list[float], global_std: bool) -> np.ndarray:
    """flow_grpo ``stat_tracking.py`` ``PerPromptStatTracker.update`` (type 'grpo', one step):
    (r − prompt mean) / (np.std + 1e-4), np.std of the prompt's rewards or of all of them."""
    prompts_arr, rewards_arr = np.array(prompts), np.array(rewards, dtype=np.float64)
    adv = np.zeros_like(rewards_arr)
    for prompt in np.unique(prompts_arr):
        group = rewards_arr[prompts_arr == prompt]
        std = (np.std(rewards_arr) if global_std else np.std(group)) + 1e-4
        adv[prompts_arr == prompt] = (group - np.mean(group)) / std
    return adv


def ref_cosmos_rl_ddrl_advantages(adv: torch.Tensor, *, exp_reward: bool, clip_min: float, clip_max: float):
    """cosmos-rl ``wfm_trainer.py`` ``rl_training_step``: A → −exp(−A) if ``exp_reward``, then the clip."""
    if exp_reward:
        adv = -torch.exp(-adv)
    return torch.clamp(adv, min=clip_min, max=clip_max)


# ============================================================== a small stand-in model


class StandInModel:
    """A velocity model of the interface the trainers call (``velocity``, adapters, text), small enough
    for float64: v = 2·tanh(x·(W + A_a·B_a) + σ·s + Σ_tokens text·P), adapters ``default`` (trained)
    and ``old``; ``adapter(None)`` is the base model (the KL reference)."""

    lora_names = ["default", "old"]
    trainable_adapter = "default"

    def __init__(self, dtype: torch.dtype = torch.float64, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        dim = math.prod(LATENT)

        def rand(*shape: int, scale: float = 0.5) -> torch.nn.Parameter:
            return torch.nn.Parameter((torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype))

        self.dtype = dtype
        self.transformer = torch.nn.Module()
        self.transformer.base = rand(dim, dim)
        self.transformer.sigma_weight = rand(dim)
        self.transformer.text_weight = rand(TEXT_DIM, dim)
        self.transformer.lora = torch.nn.ParameterDict(
            {f"{name}_{part}": rand(*shape, scale=0.3) for name in self.lora_names for part, shape in
             (("A", (dim, 2)), ("B", (2, dim)))}
        )
        for name, param in self.transformer.named_parameters():
            param.requires_grad_(".default_" in f".{name.split('.')[-1]}")
        self.active_adapter: str | None = "default"

    def trained_params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def adapter(self, name: str | None) -> Iterator[None]:
        previous, self.active_adapter = self.active_adapter, name
        try:
            yield
        finally:
            self.active_adapter = previous

    def velocity(self, latents: torch.Tensor, sigmas: torch.Tensor, text: TextConditioning) -> torch.Tensor:
        t = self.transformer
        weight = t.base
        if self.active_adapter is not None:
            weight = weight + t.lora[f"{self.active_adapter}_A"] @ t.lora[f"{self.active_adapter}_B"]
        tokens = (text.embeds.to(self.dtype) * text.mask.to(self.dtype)[..., None]).sum(1)
        sigma = sigmas.to(self.dtype).reshape(-1, 1)
        hidden = latents.to(self.dtype).flatten(1) @ weight + sigma * t.sigma_weight + tokens @ t.text_weight
        return (2 * torch.tanh(hidden)).reshape(latents.shape)

    def negative_text(self, batch: int) -> TextConditioning:
        embeds = torch.full((batch, TEXT_LEN, TEXT_DIM), 0.1, dtype=self.dtype)
        return TextConditioning(embeds, torch.tensor([[1, 0, 0]] * batch))

    # DDRL's data term: items {"pixels", "prompt"} → latents and text
    def encode_text(self, prompts: list[str]) -> TextConditioning:
        embeds = torch.stack([torch.linspace(-1, 1, TEXT_LEN * TEXT_DIM, dtype=self.dtype) * len(p) / 10 for p in prompts])
        return TextConditioning(embeds.reshape(len(prompts), TEXT_LEN, TEXT_DIM), torch.ones(len(prompts), TEXT_LEN))

    def visual_embedding(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels * 0.5

    def sample_training_sigmas(self, batch: int) -> torch.Tensor:
        return torch.rand(batch, dtype=torch.float64) * 0.8 + 0.1

    def current_device(self) -> torch.device:
        return torch.device("cpu")


def stand_in_trainer(cls, config, model: StandInModel):
    """``cls`` with the stand-in model: the parts ``loss_terms`` and ``step_advantages`` use (the
    full constructor loads a pipeline, builds optimizers and a run log, none of which they touch)."""
    trainer = cls.__new__(cls)
    trainer.config, trainer.settings, trainer.model, trainer.parallel_dims = config, settings_of(config), model, None
    keep_reference = config.train.train_policy.kl_beta > 0
    trainer.policies = RLPolicies(model, keep_old=cls.needs_old, keep_reference=keep_reference,
                                  rollout_policy=cls.rollout_policy)
    return trainer


def loss_and_grads(fn: Callable[[], torch.Tensor], params: list[torch.nn.Parameter]):
    for p in params:
        p.grad = None
    loss = fn()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in params]


def assert_rel(ours: torch.Tensor, ref: torch.Tensor, rtol: float) -> None:
    """max |ours − ref| ≤ rtol · max |ref| (relative to the tensor's scale)."""
    scale = ref.detach().abs().max().double().clamp_min(1e-30)
    err = (ours.detach().double() - ref.detach().double()).abs().max()
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol} × scale {scale:.3g}"


def texts(batch: int) -> TextConditioning:
    gen = torch.Generator().manual_seed(7)
    embeds = torch.randn(batch, TEXT_LEN, TEXT_DIM, generator=gen, dtype=torch.float64)
    return TextConditioning(embeds, torch.tensor([[1, 1, 0]] * batch))


def perturb_adapter(model: StandInModel, name: str, seed: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.transformer.lora.items():
            if key.startswith(name):
                p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * scale)


# ============================================================== Flow-GRPO


def grpo_rollout(model: StandInModel, guidance: float, *, batch: int = 4, steps: int = 4, move: float = 0.05) -> RolloutBatch:
    """SDE rollouts of the stand-in (shifted grid: every σ_t/|dt| differs), then the trained adapter
    moves, so ratios differ from 1 and the policy from the reference."""
    text = texts(batch)
    sigmas = sigma_grid(steps, shift=3.0)
    gen = torch.Generator().manual_seed(3)
    initial = torch.randn(batch, *LATENT, generator=gen)
    step_noise = torch.randn(batch, steps, *LATENT, generator=gen)
    with torch.no_grad():
        path = denoise(GuidedDenoiser(model, text, guidance_scale=guidance), initial, sigmas,
                       sampler="sde", eta=0.7, step_noise=step_noise)
    perturb_adapter(model, "default", seed=11, scale=move)
    return RolloutBatch(
        prompts=[f"p{i // 2}" for i in range(batch)], group_ids=torch.arange(batch) // 2,
        rewards=torch.zeros(batch), completions=None, text=text, sigmas=sigmas.expand(batch, -1).clone(),
        x0=path.latents[:, -1], trajectory=path.latents, log_probs=path.log_probs, components={},
    )


def grpo_config(tmp_path: Path, guidance: float, **trainer_options):
    return recipe("sana-image-grpo", tmp_path / "unused-model", tmp_path, {
        "policy.diffusers.sample.guidance_scale": guidance, "policy.diffusers.sample.noise_level": 0.7,
        "train.train_policy.kl_beta": 0.04, "train.train_policy.epsilon_low": CLIP,
        "train.train_policy.epsilon_high": CLIP, "train.train_policy.advantage_high": 5.0,
        "train.train_policy.advantage_low": -5.0, "custom.trainer": trainer_options,
    })


def ref_grpo_terms(model, batch: RolloutBatch, index, step, adv, *, guidance, detach_uncond, beta, clip_range):
    x, x_next = batch.trajectory[index, step], batch.trajectory[index, step + 1]
    sigma, sigma_next, sigma_max = batch.sigmas[index, step], batch.sigmas[index, step + 1], float(batch.sigmas[0, 1])
    text = batch.text.select(index)
    negative = model.negative_text(len(index))
    v = ref_flow_grpo_velocity(model, x, sigma, text, negative, guidance, detach_uncond)
    log_prob, mean, std_dev_t = ref_sde_step_with_logprob(v, x, x_next, sigma, sigma_next, sigma_max, 0.7)
    with torch.no_grad(), model.adapter(None):
        v_ref = ref_flow_grpo_velocity(model, x, sigma, text, negative, guidance, detach_uncond)
        _, mean_ref, _ = ref_sde_step_with_logprob(v_ref, x, x_next, sigma, sigma_next, sigma_max, 0.7)
    return ref_flow_grpo_loss(log_prob, batch.log_probs[index, step], adv, clip_range=clip_range, adv_clip_max=5.0,
                              beta=beta, mean=mean, mean_ref=mean_ref, std_dev_t=std_dev_t)


GRPO_CASES = [(1.0, "flow"), (4.5, "flow"), (4.5, "detach")]


@pytest.mark.parametrize("guidance,cfg_form", GRPO_CASES)
def test_flow_grpo_loss_and_gradient_match_flow_grpo(guidance, cfg_form, tmp_path):
    model = StandInModel()
    batch = grpo_rollout(model, guidance)
    trainer = stand_in_trainer(SanaFlowGRPOTrainer, grpo_config(tmp_path, guidance, cfg_uncond_grad=cfg_form), model)
    index, step = torch.arange(batch.size), torch.tensor([0, 1, 2, 3])  # σ = 1 (σ_max case) included
    adv = torch.tensor([1.5, -0.7, 0.3, -2.0])
    params = model.trained_params()
    ours: dict = {}

    def ours_loss():
        ours.update(trainer.loss_terms(batch, index, step, adv))
        return ours["loss"]

    loss, grads = loss_and_grads(ours_loss, params)
    refs: list = []

    def ref_loss():
        refs[:] = ref_grpo_terms(model, batch, index, step, adv, guidance=guidance,
                                 detach_uncond=cfg_form == "detach", beta=0.04, clip_range=CLIP)
        return refs[0]

    ref, ref_grads = loss_and_grads(ref_loss, params)
    assert_rel(loss, ref, FP32_RTOL)
    assert_rel(ours["policy_loss"], refs[1], FP32_RTOL)
    assert_rel(ours["kl_loss"], refs[2], FP32_RTOL)
    assert refs[2] > 1e-4 and 0 < ours["clip_fraction"] < 1  # the KL and both ratio branches take part
    for g, r in zip(grads, ref_grads):
        assert_rel(g, r, FP32_RTOL)


def test_cfg_forms_give_different_gradients(tmp_path):
    """The two CFG forms must differ (else the test above could not tell them apart)."""
    grads = {}
    for form in ("flow", "detach"):
        model = StandInModel()
        batch = grpo_rollout(model, 4.5)
        trainer = stand_in_trainer(SanaFlowGRPOTrainer, grpo_config(tmp_path, 4.5, cfg_uncond_grad=form), model)
        _, grads[form] = loss_and_grads(
            lambda: trainer.loss_terms(batch, torch.arange(4), torch.tensor([0, 1, 2, 3]),
                                       torch.tensor([1.5, -0.7, 0.3, -2.0]))["loss"], model.trained_params())
    diff = max((a - b).abs().max() / b.abs().max() for a, b in zip(grads["flow"], grads["detach"]))
    assert diff > 0.05


def test_gaussian_kl_form_is_the_exact_step_kl(tmp_path):
    """``kl_form = "gaussian"``: flow_grpo's per-sample KL divided by each step's |dt| (the exact KL of
    the two step Gaussians); on the shifted 4-step grid (σ = 1, .9, .75, .5, 0) that is 2–10 times larger."""
    model = StandInModel()
    batch = grpo_rollout(model, 1.0)
    trainer = stand_in_trainer(SanaFlowGRPOTrainer, grpo_config(tmp_path, 1.0, kl_form="gaussian"), model)
    index, step, adv = torch.arange(4), torch.tensor([0, 1, 2, 3]), torch.zeros(4)
    with torch.no_grad():
        ours = trainer.loss_terms(batch, index, step, adv)["kl_loss"]
        per_sample = [ref_grpo_terms(model, batch, index[i:i + 1], step[i:i + 1], adv[i:i + 1], guidance=1.0,
                                     detach_uncond=False, beta=0.04, clip_range=CLIP)[2] for i in range(4)]
    dt = batch.sigmas[index, step] - batch.sigmas[index, step + 1]
    expected = torch.stack(per_sample) / dt
    assert_rel(ours, expected.mean(), FP32_RTOL)
    assert ours > 2 * torch.stack(per_sample).mean()


# ============================================================== Diffusion-NFT


@pytest.mark.parametrize("kl_beta", [0.0, 0.01])
def test_nft_loss_and_gradient_match_diffusion_nft(kl_beta, tmp_path):
    model = StandInModel()
    perturb_adapter(model, "default", seed=5, scale=0.1)  # current ≠ old ≠ reference
    config = recipe("sana-image-nft", tmp_path / "unused-model", tmp_path, {
        "train.train_policy.kl_beta": kl_beta, "policy.diffusers.nft_beta": 0.1, "train.train_policy.advantage_high": 5.0,
    })
    trainer = stand_in_trainer(SanaNFTTrainer, config, model)
    gen = torch.Generator().manual_seed(4)
    batch_size = 4
    sigmas = torch.linspace(1.0, 0.0, 11, dtype=torch.float64).expand(batch_size, -1).clone()
    x0 = torch.randn(batch_size, *LATENT, generator=gen, dtype=torch.float64)
    batch = RolloutBatch(prompts=["a"] * batch_size, group_ids=torch.zeros(batch_size, dtype=torch.long),
                         rewards=torch.zeros(batch_size), completions=None, text=texts(batch_size), sigmas=sigmas,
                         x0=x0, trajectory=None, log_probs=None, components={})
    index, step = torch.arange(batch_size), torch.tensor([0, 3, 6, 9])
    adv = torch.tensor([7.0, 2.5, -1.0, -4.0], dtype=torch.float64)  # 7 is beyond the clip: r' = 1
    params = model.trained_params()
    ours: dict = {}

    def ours_loss():
        torch.manual_seed(123)  # loss_terms draws the noise of x_t first
        ours.update(trainer.loss_terms(batch, index, step, adv))
        return ours["loss"]

    loss, grads = loss_and_grads(ours_loss, params)
    refs: list = []

    def ref_loss():
        torch.manual_seed(123)
        noise = torch.randn_like(x0)
        t = sigmas[index, step]
        xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
        text = batch.text
        with torch.no_grad():
            with model.adapter("old"):
                v_old = model.velocity(xt, t, text)
            with model.adapter(None):
                v_ref = model.velocity(xt, t, text)
        v_theta = model.velocity(xt, t, text)
        refs[:] = ref_nft_loss(v_theta, v_old, v_ref, x0, xt, t, adv, beta=0.1, adv_clip_max=5.0, kl_beta=kl_beta)
        return refs[0]

    ref, ref_grads = loss_and_grads(ref_loss, params)
    torch.testing.assert_close(loss, ref, rtol=0, atol=FP64_ATOL)
    torch.testing.assert_close(ours["policy_loss"], refs[1], rtol=0, atol=FP64_ATOL)
    if kl_beta:
        torch.testing.assert_close(ours["kl_loss"], refs[2], rtol=0, atol=FP64_ATOL)
    assert all(g.dtype == torch.float64 for g in grads)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=FP64_ATOL)
    assert max(g.abs().max() for g in grads) > 1e-3  # a gradient worth comparing


# ============================================================== DDRL


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_ddrl_loss_is_flow_grpo_policy_plus_data_beta_flow_matching(guidance, tmp_path):
    model = StandInModel()
    batch = grpo_rollout(model, guidance)
    config = recipe("sana-image-ddrl", tmp_path / "unused-model", tmp_path, {
        "policy.diffusers.sample.guidance_scale": guidance, "train.train_policy.epsilon_low": CLIP,
        "train.train_policy.epsilon_high": CLIP, "custom.trainer": {"data_beta": 0.5},
    })
    trainer = stand_in_trainer(SanaDDRLTrainer, config, model)
    gen = torch.Generator().manual_seed(9)
    items = [{"pixels": torch.randint(-8, 9, LATENT, generator=gen).float() / 8, "prompt": f"real image {i}"}
             for i in range(3)]
    index, step, adv = torch.arange(4), torch.tensor([3, 2, 1, 0]), torch.tensor([1.5, -0.7, 0.3, -2.0])
    params = model.trained_params()

    def ours_loss():
        trainer.real_batches = iter([items])
        torch.manual_seed(77)
        return trainer.loss_terms(batch, index, step, adv)["loss"]

    def ref_loss():
        policy = ref_grpo_terms(model, batch, index, step, adv, guidance=guidance, detach_uncond=False,
                                beta=0.0, clip_range=CLIP)[1]
        # the data term: rectified-flow loss on the real latents at the stand-in's σ, same RNG order
        x0 = torch.stack([item["pixels"] for item in items]) * 0.5
        torch.manual_seed(77)
        sigma = model.sample_training_sigmas(len(items))
        noise = torch.randn_like(x0)
        s = sigma.view(-1, 1, 1, 1)
        v = model.velocity((1 - s) * x0 + s * noise, sigma, model.encode_text([i["prompt"] for i in items]))
        data = ((v - (noise - x0)) ** 2).mean(dim=(1, 2, 3)).mean()
        return policy + 0.5 * data  # cosmos-rl: policy_loss + kl_beta·kl_loss (0 here) + data_beta·data_loss

    loss, grads = loss_and_grads(ours_loss, params)
    ref, ref_grads = loss_and_grads(ref_loss, params)
    assert_rel(loss, ref, FP32_RTOL)
    for g, r in zip(grads, ref_grads):
        assert_rel(g, r, FP32_RTOL)


@pytest.mark.parametrize("exp_reward", [False, True])
def test_ddrl_exp_reward_matches_cosmos_rl(exp_reward, tmp_path):
    """The clip [−2, 1] cuts some advantages either way: A = 1.41 and 1.22 before the transform
    (−exp(−1) = −0.37 if clipped first), −exp(0.82) = −2.26 and −exp(1.22) = −3.39 after it."""
    config = recipe("sana-image-ddrl", tmp_path / "unused-model", tmp_path, {
        "custom.trainer": {"exp_reward": exp_reward}, "train.train_policy.advantage_low": -2.0,
        "train.train_policy.advantage_high": 1.0,
    })
    trainer = stand_in_trainer(SanaDDRLTrainer, config, StandInModel())
    rewards = [0.0, 1.0, 10.0, 0.2, 0.25, 0.3]  # A = −0.82, −0.59, 1.41 and −1.22, 0, 1.22
    batch = advantage_batch(rewards, [0, 0, 0, 1, 1, 1])
    normalised = torch.from_numpy(ref_per_prompt_advantages(["a"] * 3 + ["b"] * 3, rewards, global_std=False))
    expected = ref_cosmos_rl_ddrl_advantages(normalised, exp_reward=exp_reward, clip_min=-2.0, clip_max=1.0)
    ours = trainer.step_advantages(batch)
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=FP64_ATOL)
    if exp_reward:  # −exp(−A) < 0 for every sample; A = 0 maps to −1; two hit the lower clip
        assert (ours < 0).all() and ours[4] == pytest.approx(-1.0, abs=1e-6)
        assert ours[[0, 3]].tolist() == [-2.0, -2.0] and ours[2] == pytest.approx(-math.exp(-1.4083), abs=1e-4)
    else:
        assert ours[[2, 5]].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(("name", "trainer", "option", "value"), [
    ("sana-image-grpo", SanaFlowGRPOTrainer, "exp_reward", True),
    ("sana-image-grpo", SanaFlowGRPOTrainer, "data_beta", 0.1),
    ("sana-image-ddrl", SanaDDRLTrainer, "kl_form", "gaussian"),
    ("sana-image-nft", SanaNFTTrainer, "kl_form", "gaussian"),
    ("sana-image-nft", SanaNFTTrainer, "cfg_uncond_grad", "detach"),
    ("sana-image-nft", SanaNFTTrainer, "val_max_samples", 2),
])
def test_options_a_trainer_does_not_use_are_refused(name, trainer, option, value, tmp_path):
    config = recipe(name, tmp_path / "unused-model", tmp_path, {"custom.trainer": {option: value}})
    with pytest.raises(ValueError, match=rf"^custom\.trainer\.{option}: trainer_type '\w+' does not use this option "
                                         r"\(its options: advantage_std_ddof, "):
        trainer.check_config(config)
    ok = {"advantage_std_ddof": 1, "on_non_finite": "skip"}  # options every RL trainer reads
    trainer.check_config(recipe(name, tmp_path / "unused-model", tmp_path, {"custom.trainer": ok}))


# ============================================================== advantages


def advantage_batch(rewards: list[float], group_ids: list[int]) -> RolloutBatch:
    n = len(rewards)
    return RolloutBatch(prompts=[f"p{g}" for g in group_ids], group_ids=torch.tensor(group_ids),
                        rewards=torch.tensor(rewards, dtype=torch.float64), completions=None, text=texts(n),
                        sigmas=torch.zeros(n, 2), x0=torch.zeros(n, *LATENT), trajectory=None, log_probs=None,
                        components={})


@pytest.mark.parametrize("global_std", [False, True])
@pytest.mark.parametrize("rewards", [
    [0.1, 0.9, 0.4, 0.7, 2.0, 3.5, 2.5, 3.0, -1.0, -1.0, -1.0, -1.0],  # one group's rewards all equal
    [5.0] * 12,  # every reward equal
], ids=["mixed", "all-equal"])
def test_advantages_match_per_prompt_stat_tracker(global_std, rewards, tmp_path):
    config = recipe("sana-image-grpo", tmp_path / "unused-model", tmp_path, {
        "policy.diffusers.sample.global_std": global_std, "train.train_policy.advantage_low": -100.0,
        "train.train_policy.advantage_high": 100.0,
    })
    trainer = stand_in_trainer(SanaFlowGRPOTrainer, config, StandInModel())
    group_ids = [2, 0, 2, 0, 1, 1, 1, 1, 3, 3, 3, 3]  # groups interleaved, as rollouts may arrive
    expected = ref_per_prompt_advantages([f"p{g}" for g in group_ids], rewards, global_std)
    ours = trainer.step_advantages(advantage_batch(rewards, group_ids))
    torch.testing.assert_close(ours.double(), torch.from_numpy(expected), rtol=0, atol=FP64_ATOL)
    if len(set(rewards)) > 1:
        assert ours[8:].abs().max() == 0 and ours[:8].abs().max() > 0.05


def test_sample_std_option_is_torch_std(tmp_path):
    """``advantage_std_ddof = 1`` (cosmos-rl's WFM DDRL normalises by torch.std)."""
    config = recipe("sana-image-grpo", tmp_path / "unused-model", tmp_path, {"custom.trainer": {"advantage_std_ddof": 1}})
    trainer = stand_in_trainer(SanaFlowGRPOTrainer, config, StandInModel())
    rewards = torch.tensor([0.0, 1.0, 3.0, 4.0], dtype=torch.float64)
    ours = trainer.step_advantages(advantage_batch(rewards.tolist(), [0, 0, 0, 0]))
    torch.testing.assert_close(ours.double(), (rewards - rewards.mean()) / (rewards.std() + 1e-4), rtol=0, atol=FP64_ATOL)


def test_trainer_options_are_validated(tmp_path):
    from cosmos_sana.settings import SettingsError

    for key, value in (("kl_form", "reverse"), ("cfg_uncond_grad", "none"), ("advantage_std_ddof", 2)):
        config = recipe("sana-image-grpo", tmp_path / "unused-model", tmp_path, {"custom.trainer": {key: value}})
        with pytest.raises(SettingsError, match=f"custom.trainer.{key}"):
            settings_of(config)


# ============================================================== the tiny SANA transformer (float32)


@pytest.mark.parametrize("cfg_form", ["flow", "detach"])
def test_flow_grpo_on_tiny_sana_matches_flow_grpo(cfg_form, tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, {
        "policy.diffusers.sample.guidance_scale": 4.5, "rollout.n_generation": 2, "train.train_policy.kl_beta": 0.04,
        "train.train_policy.epsilon_low": CLIP, "train.train_policy.epsilon_high": CLIP,
        "custom.trainer.cfg_uncond_grad": cfg_form,
    })
    trainer = build_trainer(config)
    model = trainer.model
    batch = RolloutBatch.collate(scored_rollouts(build_rollout(config, model), ["a red cube", "a blue sky"], brightness),
                                 trainer.device)
    lora = lora_utils.adapter_parameters(model.transformer, "default")
    with torch.no_grad():  # the policy moves away from the rollouts' and the reference
        gen = torch.Generator().manual_seed(0)
        for p in lora.values():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    params = list(lora.values())
    index, step, adv = torch.arange(4), torch.tensor([0, 1, 2, 3]), torch.tensor([1.5, -0.7, 0.3, -2.0])
    loss, grads = loss_and_grads(lambda: trainer.loss_terms(batch, index, step, adv)["loss"], params)

    class Reference:  # flow_grpo disables the adapters for the reference forward
        def velocity(self, *args):
            with model.adapter(None):
                return model.velocity(*args)

        negative_text = staticmethod(model.negative_text)

    def ref_loss():
        x, x_next = batch.trajectory[index, step], batch.trajectory[index, step + 1]
        sigma, sigma_next = batch.sigmas[index, step], batch.sigmas[index, step + 1]
        text, negative = batch.text.select(index), model.negative_text(4)
        v = ref_flow_grpo_velocity(model, x, sigma, text, negative, 4.5, cfg_form == "detach")
        log_prob, mean, std_dev_t = ref_sde_step_with_logprob(v, x, x_next, sigma, sigma_next, float(batch.sigmas[0, 1]), 0.7)
        with torch.no_grad():
            v_ref = ref_flow_grpo_velocity(Reference(), x, sigma, text, negative, 4.5, False)
            _, mean_ref, _ = ref_sde_step_with_logprob(v_ref, x, x_next, sigma, sigma_next, float(batch.sigmas[0, 1]), 0.7)
        return ref_flow_grpo_loss(log_prob, batch.log_probs[index, step], adv, clip_range=CLIP, adv_clip_max=5.0,
                                  beta=0.04, mean=mean, mean_ref=mean_ref, std_dev_t=std_dev_t)[0]

    ref, ref_grads = loss_and_grads(ref_loss, params)
    assert_rel(loss, ref, FP32_RTOL)
    for g, r in zip(grads, ref_grads):
        assert_rel(g, r, FP32_RTOL)


# ============================================================== the recipe that claims Flow-GRPO's settings


def test_grpo_recipe_carries_flow_grpo_ocr_settings():
    """flow_grpo ``config/grpo.py`` ``general_ocr_sd3`` (over ``config/base.py``): 48 prompts × 24 images,
    10 steps (40 for evaluation), CFG 4.5, η 0.7, timestep_fraction 0.99, β 0.04, global std, clip 1e-4,
    advantages clipped at 5, lr 3e-4, EMA, two optimizer steps a step; SD3.5-M's σ grid has shift 3."""
    import tomllib

    with open(Path(__file__).resolve().parents[1] / "toml" / "sana-image-grpo.toml", "rb") as handle:
        data = tomllib.load(handle)
    diffusers, train, policy = data["policy"]["diffusers"], data["train"], data["train"]["train_policy"]
    sample, rollout = diffusers["sample"], data["custom"]["rollout"]
    assert (sample["num_steps"], sample["eval_num_steps"], sample["guidance_scale"], sample["noise_level"]) == \
        (10, 40, 4.5, 0.7)
    assert sample["global_std"] is True and diffusers["timesteps_fraction"] == 0.99
    assert (rollout["sampler"], rollout["sigma_schedule"], rollout["flow_shift"]) == ("sde", "shifted", 3.0)
    assert (policy["kl_beta"], policy["epsilon_low"], policy["epsilon_high"]) == (0.04, 1e-4, 1e-4)
    assert (policy["advantage_low"], policy["advantage_high"]) == (-5.0, 5.0)
    gpus = data["policy"]["parallelism"]["dp_shard_size"]
    assert train["train_batch_per_replica"] == 48 * data["rollout"]["n_generation"] == 48 * 24
    assert train["train_batch_per_replica"] // gpus // policy["batch_size_per_optimize"] == 2
    assert (train["optm_lr"], train["optm_weight_decay"], train["optm_grad_norm_clip"], train["ema_enable"]) == \
        (3e-4, 1e-4, 1.0, True)
    trainer = data["custom"].get("trainer", {})
    assert trainer.get("kl_form", "flow_grpo") == "flow_grpo" and trainer.get("cfg_uncond_grad", "flow") == "flow"


def test_nft_on_tiny_sana_matches_diffusion_nft(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = recipe("sana-image-nft", tiny_image_pipeline_dir, tmp_path, {
        "rollout.n_generation": 2, "train.train_policy.kl_beta": 0.01, "policy.diffusers.nft_beta": 0.1,
    })
    trainer = build_trainer(config)
    model = trainer.model
    batch = RolloutBatch.collate(scored_rollouts(build_rollout(config, model), ["a red cube", "a blue sky"], brightness),
                                 trainer.device)
    lora = lora_utils.adapter_parameters(model.transformer, "default")
    with torch.no_grad():  # current ≠ old ≠ reference
        gen = torch.Generator().manual_seed(0)
        for p in lora.values():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    params = list(lora.values())
    index, step, adv = torch.arange(4), torch.tensor([0, 1, 2, 3]), torch.tensor([7.0, 2.5, -1.0, -4.0])

    def ours_loss():
        torch.manual_seed(5)
        return trainer.loss_terms(batch, index, step, adv)["loss"]

    def ref_loss():
        torch.manual_seed(5)
        x0, t = batch.x0[index], batch.sigmas[index, step]
        xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * torch.randn_like(x0)
        with torch.no_grad():
            with model.adapter("old"):
                v_old = model.velocity(xt, t, batch.text)
            with model.adapter(None):
                v_ref = model.velocity(xt, t, batch.text)
        v_theta = model.velocity(xt, t, batch.text)
        return ref_nft_loss(v_theta, v_old, v_ref, x0, xt, t, adv, beta=0.1, adv_clip_max=5.0, kl_beta=0.01)[0]

    loss, grads = loss_and_grads(ours_loss, params)
    ref, ref_grads = loss_and_grads(ref_loss, params)
    assert_rel(loss, ref, FP32_RTOL)
    for g, r in zip(grads, ref_grads):
        assert_rel(g, r, FP32_RTOL)
