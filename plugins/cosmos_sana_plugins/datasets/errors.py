"""Bad samples: one named error each, and the ``on_bad_sample`` policy ("fail" | "skip")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from cosmos_sana.log import get_logger

logger = get_logger(__name__)

OnBadSample = Literal["fail", "skip"]


@dataclass(frozen=True)
class BadSample:
    """Where a sample lives (file, ``file:line`` or ``archive.zip:member``) and what is wrong."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


class BadSampleError(ValueError):
    """A sample cannot be used; the message names its file and the reason."""

    def __init__(self, where: str, reason: str):
        self.bad = BadSample(str(where), reason)
        super().__init__(str(self.bad))


class BadSamplePolicy:
    """Applies ``on_bad_sample``: raise at once, or record, warn and let the caller skip."""

    def __init__(self, on_bad_sample: OnBadSample, dataset: str):
        if on_bad_sample not in ("fail", "skip"):
            raise ValueError(f"on_bad_sample must be 'fail' or 'skip', got {on_bad_sample!r}")
        self.on_bad_sample = on_bad_sample
        self.dataset = dataset
        self.skipped: list[BadSample] = []

    def handle(self, error: BadSampleError) -> None:
        """Re-raise under "fail"; under "skip" record the sample and log it."""
        if self.on_bad_sample == "fail":
            raise error
        self.skipped.append(error.bad)
        logger.warning("%s: skipping bad sample %s (%d skipped so far)", self.dataset, error.bad, len(self.skipped))

    def report_index(self, total: int) -> None:
        """Log the skip count after indexing ``total`` candidate samples."""
        if self.skipped:
            logger.warning(
                "%s: skipped %d of %d samples (on_bad_sample=skip)", self.dataset, len(self.skipped), total
            )


class DatasetError(ValueError):
    """The dataset as a whole is unusable (missing path, unknown layout, malformed index file)."""


def json_object(line: str, where: str) -> dict[str, Any]:
    """One JSON object from a manifest line, or a :class:`BadSampleError` naming ``where``."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadSampleError(where, f"invalid JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise BadSampleError(where, f"expected a JSON object, got {type(record).__name__}")
    return record
