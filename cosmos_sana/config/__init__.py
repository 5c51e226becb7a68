"""The ``[custom]`` table of a cosmos-rl TOML, owned by cosmos-sana.

cosmos-rl forwards ``[custom]`` verbatim to every worker, so all settings it has
no field for live here. A TOML opts into cosmos-sana with
``[custom] package = "cosmos-sana"``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cosmos_sana.config.base import ComponentRef, StrictModel
from cosmos_sana.config.checkpoint import CheckpointOptions
from cosmos_sana.config.data import DataRef
from cosmos_sana.config.guards import GuardOptions
from cosmos_sana.config.logging import LoggingOptions
from cosmos_sana.config.model import ModelOptions
from cosmos_sana.config.reward import RewardRef, RewardRuntime
from cosmos_sana.config.rollout import RolloutOptions
from cosmos_sana.config.trainer import TrainerOptions

PACKAGE_MARKER = "cosmos-sana"


class SanaCustomConfig(StrictModel):
    package: Literal["cosmos-sana"] = Field(description='marks the TOML as a cosmos-sana recipe')
    plugins: list[str] = Field(
        default_factory=list,
        description="distributions whose plugins this recipe needs; a missing one is an error",
    )
    model: ModelOptions = Field(default_factory=ModelOptions)
    data: DataRef | None = Field(default=None, description="training dataset (prompts for RL)")
    val_data: DataRef | None = Field(default=None, description="validation dataset")
    real_data: DataRef | None = Field(default=None, description="real data for DDRL's data term")
    rewards: list[RewardRef] = Field(default_factory=list, description="weighted reward terms")
    reward_runtime: RewardRuntime = Field(default_factory=RewardRuntime)
    rollout: RolloutOptions = Field(default_factory=RolloutOptions)
    trainer: TrainerOptions = Field(default_factory=TrainerOptions)
    checkpoint: CheckpointOptions = Field(default_factory=CheckpointOptions)
    logging: LoggingOptions = Field(default_factory=LoggingOptions)
    guards: GuardOptions = Field(default_factory=GuardOptions)


def wants_cosmos_sana(config: dict[str, Any]) -> bool:
    """True when a raw TOML dict opts into cosmos-sana."""
    custom = config.get("custom")
    return isinstance(custom, dict) and custom.get("package") == PACKAGE_MARKER


__all__ = [
    "CheckpointOptions",
    "ComponentRef",
    "LoggingOptions",
    "RolloutOptions",
    "TrainerOptions",
    "DataRef",
    "GuardOptions",
    "ModelOptions",
    "PACKAGE_MARKER",
    "RewardRef",
    "RewardRuntime",
    "SanaCustomConfig",
    "StrictModel",
    "wants_cosmos_sana",
]
