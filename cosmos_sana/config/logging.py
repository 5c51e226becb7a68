"""``[custom.logging]``: what cosmos-sana logs, and where."""

from __future__ import annotations

from pydantic import Field

from cosmos_sana.config.base import StrictModel


class LoggingOptions(StrictModel):
    media_every: int = Field(default=10, ge=0, description="log rollout images/videos every N steps (0: never)")
    progress_bar: bool = Field(default=True, description="show a progress bar with ETA on rank 0")
