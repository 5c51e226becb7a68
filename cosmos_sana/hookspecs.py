"""The one extension surface of cosmos-sana.

A plugin is a module (or object) exposed through the ``cosmos_sana.plugins``
entry-point group::

    [project.entry-points."cosmos_sana.plugins"]
    my_rewards = "my_package.cosmos_plugin"

and implementing any of the hooks below with ``@cosmos_sana.hookimpl``. Each hook
returns a list of specs (:mod:`cosmos_sana.specs`); a spec names a component and
points at its implementation, either as an object or a lazy ``"module:attr"``
string so that listing plugins imports nothing heavy.

Names are global per kind: two plugins registering the same reward name is an
error naming both distributions.
"""

from __future__ import annotations

import pluggy

from cosmos_sana.specs import (
    DataPackerSpec,
    DatasetSpec,
    ModelSpec,
    RewardSpec,
    RolloutSpec,
    TrainerSpec,
)

PROJECT_NAME = "cosmos_sana"
ENTRY_POINT_GROUP = "cosmos_sana.plugins"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def cosmos_sana_models() -> list[ModelSpec]:
    """Model adapters, registered into cosmos-rl's ``ModelRegistry``.

    ``ModelSpec.pipeline_classes`` are the ``model_index.json`` ``_class_name``
    values the adapter serves (e.g. ``SanaPipeline``).
    """


@hookspec
def cosmos_sana_datasets() -> list[DatasetSpec]:
    """Datasets selectable as ``[custom.data] kind = NAME``."""


@hookspec
def cosmos_sana_data_packers() -> list[DataPackerSpec]:
    """Data packers, registered with cosmos-rl's ``BaseDataPacker``."""


@hookspec
def cosmos_sana_rewards() -> list[RewardSpec]:
    """Reward functions selectable in ``[[custom.rewards]] name = NAME``."""


@hookspec
def cosmos_sana_trainers() -> list[TrainerSpec]:
    """Trainers, registered into cosmos-rl's ``TrainerRegistry``."""


@hookspec
def cosmos_sana_rollouts() -> list[RolloutSpec]:
    """Rollout backends, registered into cosmos-rl's ``RolloutRegistry``."""
