"""``[custom.data]``, ``[custom.val_data]``, ``[custom.real_data]``: datasets by plugin name."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosmos_sana.config.base import ComponentRef


class DataRef(ComponentRef):
    on_bad_sample: Literal["fail", "skip"] = Field(
        default="fail", description="fail at once on a bad sample, or skip it and report the count"
    )
