"""``[custom.checkpoint]``: what cosmos-rl's ``[train.ckpt]`` lacks for DCP checkpoints.

Saving cadence, retention and resume use cosmos-rl's own fields:
``train.ckpt.enable_checkpoint``, ``train.ckpt.save_freq``, ``train.ckpt.max_keep``
and ``train.resume`` (``true`` = latest complete checkpoint under the output dir,
or a checkpoint path).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from cosmos_sana.config.base import StrictModel

SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?B)?\s*$", re.IGNORECASE)


class CheckpointOptions(StrictModel):
    init_from: str | None = Field(
        default=None,
        description="folder written by `cosmos-sana convert-to-dcp`; its model/ initialises the transformer",
    )
    chunk_size: str = Field(default="5GB", description="approximate size of each DCP data file per rank")

    @field_validator("chunk_size")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_size(value)  # a positive size like '5GB', '512MB' or '1048576'
        return value


def parse_size(value: str | int) -> int:
    """Bytes in ``"5GB"``, ``"100KB"``, ``"1048576"`` or an int (decimal units, like diffusers' shard sizes)."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"size must be positive, got {value}")
        return value
    match = SIZE_PATTERN.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a size like '5GB', '512MB' or '1048576'")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
