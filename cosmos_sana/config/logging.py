"""``[custom.logging]``: what cosmos-sana adds to cosmos-rl's ``[logging]``.

Backends (``logger = ["console", "wandb"]``), project/experiment names and the media
interval (``multi_modal_log_interval``) are cosmos-rl's own fields. Metrics also go to
``<train.output_dir>/logs/metrics.jsonl`` and media to ``<train.output_dir>/logs/media/``.
"""

from __future__ import annotations

from pydantic import Field

from cosmos_sana.config.base import StrictModel


class LoggingOptions(StrictModel):
    progress_bar: bool = Field(default=True, description="show a progress bar with ETA on rank 0")
    media_count: int = Field(default=4, ge=0, description="rollout/validation samples saved per logged step")
