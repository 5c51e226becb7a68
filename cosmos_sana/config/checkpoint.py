"""``[custom.checkpoint]``: DCP training checkpoints."""

from __future__ import annotations

from pydantic import Field

from cosmos_sana.config.base import StrictModel


class CheckpointOptions(StrictModel):
    enabled: bool = Field(default=True, description="write DCP checkpoints")
    save_every: int = Field(default=20, ge=1, description="steps between checkpoints")
    keep_last: int = Field(default=3, ge=1, description="completed checkpoints kept")
    resume: bool | str = Field(default=False, description="true: latest under the output dir; or a checkpoint path")
