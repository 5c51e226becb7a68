"""The policies an RL trainer keeps beside the trained one: ``old`` (NFT's sampling policy)
and the frozen reference (KL).

With LoRA they are adapters of the one transformer (``old`` = the ``old`` adapter, the
reference = adapters disabled); full-parameter training keeps frozen copies of the
transformer instead. :class:`TransformerView` puts any transformer behind the model's
interface so :func:`~cosmos_sana_plugins.sana.sampling.sample` can run on it (the ``old`` copy, a merged/compiled preview).
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator
from types import MethodType
from typing import Any

import torch

from cosmos_sana_plugins.trainers import data_parallel

OLD = "old"


class TransformerView:
    """``model`` with ``transformer`` replaced: ``velocity`` runs ``transformer``, the rest delegates."""

    def __init__(self, model: Any, transformer: torch.nn.Module) -> None:
        self._model = model
        self.transformer = transformer

    def velocity(self, latents: torch.Tensor, sigmas: torch.Tensor, text: Any) -> torch.Tensor:
        return self.transformer(**self._model.transformer_inputs(latents, sigmas, text))[0].float()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class RLPolicies:
    """Views of the ``old`` and reference policies, the ``old`` update, and what rollouts sample with.

    ``rollout_policy`` is ``"old"`` (Diffusion-NFT samples with the old policy) or ``"current"``.
    ``version`` counts changes of the rollout policy's weights (caches of merged copies key on it).
    ``completed_steps`` is the trainer's count of finished training steps (restored on resume): the
    colocated rollout derives its sampling seeds from it.

    The model and ``evaluation_weights`` (a bound method of the trainer) are held weakly: the
    trainer link (:mod:`~cosmos_sana_plugins.trainers.rollout_link`) keeps these policies alive for
    as long as the model lives, and a strong reference back would keep the model alive for ever.
    Once the trainer is gone its evaluation weights are too: the evaluation view is then the
    current weights.
    """

    def __init__(
        self,
        model: Any,
        *,
        keep_old: bool,
        keep_reference: bool,
        rollout_policy: str,
        evaluation_weights: MethodType | None = None,
    ) -> None:
        if rollout_policy not in ("old", "current"):
            raise ValueError(f"rollout_policy must be 'old' or 'current', got {rollout_policy!r}")
        if rollout_policy == "old" and not keep_old:
            raise ValueError("sampling with the old policy needs keep_old=True")
        self._model = weakref.ref(model)
        self.rollout_policy = rollout_policy
        self._evaluation_weights = None if evaluation_weights is None else weakref.WeakMethod(evaluation_weights)
        self.version = 0
        self.completed_steps = 0
        self.is_lora = bool(model.lora_names)
        self.keep_old, self.keep_reference = keep_old, keep_reference
        self.old: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        if self.is_lora:
            if keep_old and OLD not in model.lora_names:
                raise ValueError(f"[policy.lora] lora_names must include {OLD!r} (got {model.lora_names})")
            if keep_old and model.trainable_adapter == OLD:
                raise ValueError(f"[policy.lora] primary_adapter must not be {OLD!r}")
        else:
            if keep_old:
                self.old = self._frozen_copy()
            if keep_reference:
                self.reference = self._frozen_copy()

    @property
    def model(self) -> Any:
        """The model these policies belong to."""
        model = self._model()
        if model is None:
            raise RuntimeError("the model these policies belong to was garbage collected")
        return model

    def _frozen_copy(self) -> torch.nn.Module:
        clone = copy.deepcopy(self.model.transformer)
        clone.requires_grad_(False)
        clone.eval()
        return clone

    @contextlib.contextmanager
    def view(self, which: str) -> Iterator[Any]:
        """The model as policy ``which`` ("current", "old", "reference") sees it, for the block."""
        if which == "current":
            yield self.model
            return
        if which not in ("old", "reference"):
            raise ValueError(f"unknown policy {which!r}")
        if (which == "old" and not self.keep_old) or (which == "reference" and not self.keep_reference):
            raise RuntimeError(f"this trainer keeps no {which} policy")
        if self.is_lora:
            with self.model.adapter(OLD if which == "old" else None):
                yield self.model
        else:
            yield TransformerView(self.model, self.old if which == "old" else self.reference)

    @torch.no_grad()
    def velocity(self, which: str, latents: torch.Tensor, sigmas: torch.Tensor, text: Any) -> torch.Tensor:
        """Velocity of the frozen policy ``which`` (no gradient)."""
        with self.view(which) as model:
            return model.velocity(latents, sigmas, text)

    def reshard(self) -> None:
        """Free weights that gradient-free forwards left gathered (FSDP2 with
        ``train.fsdp_reshard_after_forward = "never"``), so code that reads or writes parameters sees
        the sharded ones; a no-op without FSDP."""
        for module in (self.model.transformer, self.old, self.reference):
            if module is not None:
                data_parallel.reshard(module)

    @torch.no_grad()
    def update_old(self, decay: float) -> None:
        """``old ← decay·old + (1 − decay)·current``."""
        self.reshard()
        if self.is_lora:
            self.model.blend_adapters(self.model.trainable_adapter, OLD, decay)
        else:
            current = list(self.model.transformer.parameters())
            torch._foreach_lerp_(list(self.old.parameters()), current, 1.0 - decay)
        if self.rollout_policy == "old":
            self.version += 1

    def current_changed(self) -> None:
        """Call after an optimizer step."""
        if self.rollout_policy == "current":
            self.version += 1

    @contextlib.contextmanager
    def rollout_view(self) -> Iterator[Any]:
        """The model as rollouts must see it (weights resharded afterwards)."""
        try:
            with self.view(self.rollout_policy) as model:
                yield model
        finally:
            self.reshard()

    @contextlib.contextmanager
    def evaluation_view(self) -> Iterator[Any]:
        """The current policy with its evaluation weights (the trainer's EMA, when on), weights resharded afterwards."""
        weights = None if self._evaluation_weights is None else self._evaluation_weights()
        try:
            with contextlib.nullcontext() if weights is None else weights():
                yield self.model
        finally:
            self.reshard()

    def checkpoint_parts(self) -> dict[str, Any]:
        """The full-parameter ``old`` copy (LoRA ``old`` travels with the model part; the
        reference is the base pipeline, reloaded at start)."""
        from cosmos_sana.checkpoint import ModelState

        return {"old_model": ModelState(self.old)} if self.old is not None else {}
