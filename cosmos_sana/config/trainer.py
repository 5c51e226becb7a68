"""``[custom.trainer]``: algorithm options cosmos-rl's config has no field for."""

from __future__ import annotations

from pydantic import Field

from cosmos_sana.config.base import StrictModel


class TrainerOptions(StrictModel):
    ema_decay: float | None = Field(default=None, ge=0.0, lt=1.0, description="EMA of trained weights; off when unset")
