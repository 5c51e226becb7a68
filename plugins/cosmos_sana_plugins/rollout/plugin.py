"""Entry point of the built-in rollout plugin: ``[rollout] backend = "sana"``."""

from __future__ import annotations

from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import RolloutSpec


@hookimpl
def cosmos_sana_rollouts() -> list[RolloutSpec]:
    return [
        RolloutSpec(
            name="sana",
            target="cosmos_sana_plugins.rollout.rollout:SanaRollout",
            description="colocated SANA/SANA-Video rollouts: ODE/SDE/CPS, per-prompt groups, best-of-n",
        )
    ]
