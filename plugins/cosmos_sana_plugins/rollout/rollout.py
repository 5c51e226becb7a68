"""``[rollout] backend = "sana"``: the colocated rollout for SANA / SANA-Video.

Samples with :func:`cosmos_sana_plugins.sana.sampling.sample` (``[custom.rollout] sampler``, ``[policy.diffusers.sample]``) on
the policy the colocated trainer asks for through the
:class:`~cosmos_sana_plugins.trainers.rollout_link.TrainerLink` it attached to the model (NFT's
``old``, else the current weights; without a trainer, the model as it is), optionally best-of-n
(``[custom.rollout.best_of_n]``). ``P`` prompts give a prompt-major batch of ``P·n`` samples;
prompt ``i`` owns rows ``[i·n, (i+1)·n)``.

Each ``RolloutResult`` carries ``completions`` (media ``[n, …]`` in [0, 1], what rewards
score) and, per sample, the ``extra_info`` the trainers read: ``x0`` (final latents),
``sigmas`` (the σ grid), ``text_embeds``/``text_mask``, ``seeds`` and, for stochastic
samplers, ``trajectory`` (every latent) and ``log_probs`` (per step). It sets
``completion_trainable`` — without it cosmos-rl drops ``extra_info`` on the way to the trainer.

Sampling seeds are derived, not drawn from a running generator (:mod:`cosmos_sana.seeds`): the
``k``-th sample generated for a step is seeded by ``(train.seed, rank, completed steps, k)``. The
completed steps are the colocated trainer's count (``TrainerLink.completed_steps``, restored
with its checkpoint; cosmos-rl's ``current_weight_version`` advances only every
``train.sync_weight_interval`` steps, so it serves only rollouts without a trainer). A resumed run
therefore samples step ``N`` exactly as the uninterrupted run did, and validation (seeded by
``(train.seed, prompt index, j)``, the same every round) never shifts the training seeds.

With ``[custom.reward_runtime] mode = "async"`` (the default) every sampled chunk is
submitted for scoring at once and each payload's prompt is tagged with its samples' ids
(:mod:`cosmos_sana_plugins.rollout.reward_submission`); the reward function collects them.

``[custom.rollout.speed]`` installs :mod:`~cosmos_sana_plugins.sana.fast_denoise`'s features once,
on the model (and a full-parameter ``old`` copy), and every view samples through one ``FastModel``.
``COSMOS_SANA_ROLLOUT_DUMP=<folder>`` saves the first training step's rollouts there
(:mod:`~cosmos_sana_plugins.rollout.rollout_dump`), to compare two launches sample by sample.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from cosmos_rl.rollout.rollout_base import RolloutBase
from cosmos_rl.rollout.schema import RolloutResult

from cosmos_sana.compat.cosmos_rl import reports_rewards
from cosmos_sana.config.rollout import SpeedOptions
from cosmos_sana.log import get_logger
from cosmos_sana.payload_prompt import parse_prompt
from cosmos_sana.rewards.ledger import shared_scheduler, shared_scorers
from cosmos_sana.seeds import derive_seed
from cosmos_sana.settings import settings_of
from cosmos_sana.step_clock import STEP_CLOCK
from cosmos_sana_plugins.datasets.grouping import group_slices
from cosmos_sana_plugins.rollout.best_of_n import (
    BestOfNSampler,
    MergedTransformer,
    check_preview_support,
    sample_in_chunks,
    transformer_for,
)
from cosmos_sana_plugins.rollout.reward_submission import RewardSubmission
from cosmos_sana_plugins.rollout.rollout_dump import FirstStepDump
from cosmos_sana_plugins.trainers.policies import OLD, TransformerView
from cosmos_sana_plugins.trainers.rollout_link import link_of

logger = get_logger(__name__)


def accelerate_for_rollout(model: Any, speed: SpeedOptions) -> Any:
    """Install ``speed`` on ``model`` and its full-parameter ``old`` copy; the ``FastModel`` to sample with."""
    from cosmos_sana_plugins.sana.fast_denoise import accelerate

    device = model.current_device()
    if speed.cuda_graph_max_batch and device.type != "cuda":
        raise ValueError(
            f"custom.rollout.speed.cuda_graph_max_batch = {speed.cuda_graph_max_batch} needs a CUDA GPU "
            f"(the model is on {device}); set it to 0"
        )
    link = link_of(model)
    if link is not None and link.old is not None:
        transformer_only = speed.model_copy(update={"vae_channels_last": False, "compile_vae": False})
        accelerate(TransformerView(model, link.old), transformer_only)
    return accelerate(model, speed)


class SanaRollout(RolloutBase):
    def post_init_hook(self, **kwargs: Any) -> None:
        from cosmos_sana.plugin_manager import installed_plugins

        self.settings = settings_of(self.config)
        self.registry = installed_plugins()  # the reward scorers' plugins
        self.model: Any = None
        self._base_seed = self.config.train.seed or 0
        self._rank = int(os.environ.get("RANK", 0))
        self._seed_step: int | None = None  # the completed-step count the seeds drawn so far belong to
        self._drawn = 0  # samples seeded since that count last changed
        self._best_of_n: BestOfNSampler | None = None
        self._merged: dict[str, MergedTransformer] = {}
        self._fast: Any = None  # fast_denoise.FastModel when [custom.rollout.speed] is on
        self._dump = FirstStepDump.from_env(self._rank)  # COSMOS_SANA_ROLLOUT_DUMP, off when unset

    # ------------------------------------------------------------------ cosmos-rl API
    def init_engine(self, quantization: str | None = None, seed: int | None = None, load_format: str = "auto", **kwargs: Any) -> None:
        if seed is not None:  # every rank derives its own seeds (the rank is part of each)
            self._base_seed = int(seed)
        self._engine_initialized = True

    def get_underlying_model(self) -> Any:
        return self.model

    def set_underlying_model(self, model: Any) -> None:
        """Colocated: the policy's model object itself (no weight copy)."""
        self.model = model
        speed = self.settings.rollout.speed
        if speed.enabled and (self._fast is None or self._fast.model is not model):
            self._fast = accelerate_for_rollout(model, speed)
        options = self.settings.rollout.best_of_n
        if options is not None and self._best_of_n is None:
            self._setup_best_of_n(options)

    def _setup_best_of_n(self, options: Any) -> None:
        check_preview_support(options.preview_model, self.model.current_device())
        scorers = shared_scorers(self.settings, self.registry, self.model.current_device())
        self._best_of_n = BestOfNSampler(
            options, self.config.rollout.n_generation, lambda media, prompts, meta: scorers.score(media, prompts, meta).total
        )
        for kind in {options.preview_model, options.fullrollout_model} - {"peft"}:
            self._merged[kind] = MergedTransformer(kind, self._rollout_source, self._rollout_version)

    def _rollout_source(self) -> tuple[torch.nn.Module, str | None]:
        link = link_of(self.model)
        old = link is not None and link.rollout_policy == "old"
        if not self.model.lora_names:
            return (link.old if old else self.model.transformer), None
        return self.model.transformer, OLD if old else self.model.trainable_adapter

    def _rollout_version(self) -> int:
        link = link_of(self.model)
        return link.version if link is not None else 0

    def _view(self, is_validation: bool) -> contextlib.AbstractContextManager[Any]:
        """Rollouts: the policy the trainer samples with; validation: the current (EMA) weights."""
        link = link_of(self.model)
        if link is None:
            return contextlib.nullcontext(self.model)
        return link.evaluation_view() if is_validation else link.rollout_view()

    def _fast_view(self, view: Any) -> contextlib.AbstractContextManager[Any]:
        """``view`` sampled through the speed features' ``FastModel``, when on."""
        return contextlib.nullcontext(view) if self._fast is None else self._fast.using(view)

    def _completed_steps(self, weight_version: int | None) -> int | None:
        """Training steps behind this generation: the colocated trainer's count, else cosmos-rl's
        ``current_weight_version``, else None (callers outside a training loop)."""
        link = link_of(self.model)
        return link.completed_steps if link is not None else weight_version

    def _start_seeds(self, step: int | None) -> None:
        """Seeds of a new step count from 0 again; without a step the count just goes on."""
        if step is not None and step != self._seed_step:
            self._seed_step, self._drawn = int(step), 0

    def _draw_seeds(self, count: int) -> list[int]:
        """The next ``count`` training seeds of the current step."""
        first, self._drawn = self._drawn, self._drawn + count
        step = -1 if self._seed_step is None else self._seed_step
        return [derive_seed(self._base_seed, "rollout", self._rank, step, k) for k in range(first, first + count)]

    def _validation_seeds(self, payloads: list[Any], n: int) -> list[int]:
        """Per validation prompt the same ``n`` seeds every round (comparable across steps)."""
        return [
            derive_seed(self._base_seed, "validation", getattr(p, "prompt_idx", i), j)
            for i, p in enumerate(payloads)
            for j in range(n)
        ]

    def _reward_submission(self, payloads: list[Any], n: int, timed: bool) -> RewardSubmission | None:
        """Async scoring of this call's samples, unless inline or cosmos-rl won't score this rank's."""
        if (
            self.settings.reward_runtime.mode != "async"
            or self.config.train.train_policy.bypass_reward
            or not reports_rewards(self.parallel_dims)
        ):
            return None
        scheduler = shared_scheduler(self.settings, self.registry, self.model.current_device())
        return RewardSubmission(scheduler, payloads, n, timed=timed)

    @torch.no_grad()
    def rollout_generation(
        self,
        payloads: list[Any],
        stream: Any = None,
        data_packer: Any = None,
        data_fetcher: Any = None,
        is_validation: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> list[RolloutResult]:
        from cosmos_sana_plugins.sana.sampling import sampler_settings

        if self.model is None:
            raise RuntimeError("rollout has no model: cosmos-rl's colocated loop must set_underlying_model first")
        started = STEP_CLOCK.now()
        if not is_validation:
            self._start_seeds(self._completed_steps(kwargs.get("current_weight_version")))
        n = self.config.validation.n_generation if is_validation else self.config.rollout.n_generation
        items = [parse_prompt(p.prompt, f"payload {getattr(p, 'prompt_idx', i)}") for i, p in enumerate(payloads)]
        prompts, metadata = [t for t, _ in items], [m for _, m in items]
        settings = sampler_settings(self.config, self.model, validation=is_validation)
        text = self.model.encode_text(prompts)
        holdout = is_validation and bool(self.settings.guards.holdout_rewards)  # scored inline by other scorers
        submission = None if holdout else self._reward_submission(payloads, n, timed=not is_validation)
        on_chunk = None if submission is None else submission.on_chunk
        first_drawn = self._drawn
        with self._view(is_validation) as policy_view, self._fast_view(policy_view) as view:
            if self._best_of_n is not None and not is_validation:
                options = self.settings.rollout.best_of_n
                out, seeds, _ = self._best_of_n.generate(
                    transformer_for(options.preview_model, view, self._merged.get(options.preview_model)),
                    transformer_for(options.fullrollout_model, view, self._merged.get(options.fullrollout_model)),
                    text, prompts, metadata, settings, self._draw_seeds, on_chunk,
                )
            else:
                seeds = self._validation_seeds(payloads, n) if is_validation else self._draw_seeds(len(prompts) * n)
                chunk = self.config.rollout.n_generation_mini_batch or len(seeds)
                out = sample_in_chunks(view, text.repeat_interleave(n), seeds, settings, chunk, on_chunk)
        if self._dump is not None and not is_validation and self._dump.wants(self._seed_step):
            self._dump.save(self._seed_step, first_drawn, out.latents, out.media, seeds)
        results = self._results(payloads, n, out, text.repeat_interleave(n), seeds, is_validation)
        if submission is not None:
            submission.finish(payloads, results, out.media)
        if not is_validation:  # validation runs between steps; it is no part of one
            STEP_CLOCK.add("rollout", started)
        logger.info("rollout: %d prompts x %d in %.2f s", len(payloads), n, STEP_CLOCK.now() - started)
        return results

    def _results(self, payloads: list[Any], n: int, out: Any, text: Any, seeds: list[int], is_validation: bool) -> list[RolloutResult]:
        traj = out.trajectory
        stochastic = traj.sampler != "ode"
        per_sample = {
            "x0": out.latents,
            "sigmas": traj.sigmas.expand(len(seeds), -1),
            "text_embeds": text.embeds,
            "text_mask": text.mask,
            "seeds": torch.tensor(seeds),
        }
        if stochastic:
            per_sample["trajectory"] = traj.latents
            per_sample["log_probs"] = traj.log_probs
        results = []
        for payload, rows in zip(payloads, group_slices(len(payloads), n)):
            results.append(
                RolloutResult(
                    prompt=payload.prompt,
                    completions=out.media[rows],
                    completion_trainable=None if is_validation else [True] * n,
                    extra_info={
                        "modality": "video" if self.model.is_video else "image",
                        **{key: value[rows] for key, value in per_sample.items()},
                    },
                )
            )
        return results
