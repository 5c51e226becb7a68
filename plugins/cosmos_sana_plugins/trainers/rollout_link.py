"""The typed link from an RL trainer to the colocated rollout that samples the trainer's model.

cosmos-rl hands the colocated rollout the policy's model object itself (``set_underlying_model``)
and nothing else of the trainer, so the trainer registers a :class:`TrainerLink` for its model
with :func:`attach` and the rollout looks it up with :func:`link_of`. A model no RL trainer
attached a link to (a rollout without a trainer in its process) has none: the rollout then samples
the model as it is and seeds from cosmos-rl's weight version.

The links live in a dictionary keyed weakly by the model: an entry lasts as long as its model and
goes when the model is garbage collected. The link keeps the trainer's :class:`RLPolicies` alive
and those refer to the model and the trainer only weakly, so an entry never keeps its own key
alive. docs/architecture.md, "Trainer–rollout link and process-wide state", lists this and the
other process-wide objects.

This module lives in the trainers package because the rollout plugin already depends on it
(never the reverse): the dependency between the two plugin packages stays one-way.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from cosmos_sana_plugins.trainers.policies import RLPolicies


@dataclass(frozen=True, eq=False)
class TrainerLink:
    """What an RL trainer offers the rollout that samples its model; read-only on the rollout side."""

    policies: RLPolicies
    """The trainer's policies; the trainer updates them, the rollout only reads them through the
    members below."""

    @property
    def rollout_policy(self) -> str:
        """``"old"`` (Diffusion-NFT samples with the old policy) or ``"current"``."""
        return self.policies.rollout_policy

    @property
    def old(self) -> torch.nn.Module | None:
        """The full-parameter ``old`` transformer; None with LoRA (the ``old`` adapter of the model's
        own transformer) or when the trainer keeps no old policy."""
        return self.policies.old

    @property
    def version(self) -> int:
        """Changes of the rollout policy's weights so far; caches of merged weights key on it."""
        return self.policies.version

    @property
    def completed_steps(self) -> int:
        """The trainer's finished training steps (restored on resume); sampling seeds derive from it."""
        return self.policies.completed_steps

    def rollout_view(self) -> contextlib.AbstractContextManager[Any]:
        """The model as training rollouts sample it (the ``rollout_policy``)."""
        return self.policies.rollout_view()

    def evaluation_view(self) -> contextlib.AbstractContextManager[Any]:
        """The current policy with the trainer's evaluation weights (its EMA, when on), for validation."""
        return self.policies.evaluation_view()


_LINKS: weakref.WeakKeyDictionary[Any, TrainerLink] = weakref.WeakKeyDictionary()


def attach(model: Any, link: TrainerLink) -> None:
    """Make ``link`` the one :func:`link_of` returns for ``model`` (once per model)."""
    if link.policies.model is not model:
        raise ValueError("a trainer link must be attached to the model its policies belong to")
    attached = _LINKS.get(model)
    if attached is not None and attached is not link:
        raise ValueError(f"{type(model).__name__} already has a trainer link: one RL trainer per model")
    _LINKS[model] = link


def link_of(model: Any) -> TrainerLink | None:
    """The link an RL trainer attached to ``model``, or None (no RL trainer trains it)."""
    return _LINKS.get(model)
