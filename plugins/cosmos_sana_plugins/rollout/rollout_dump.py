"""Opt-in dump of the first training step's rollouts, to compare two launches sample by sample.

``COSMOS_SANA_ROLLOUT_DUMP=<folder>`` makes the ``sana`` rollout save every training rollout call of
the first step it samples as ``<folder>/step<S>-rank<R>-first<K>.safetensors``: ``latents`` (the
final latents), ``media`` (what the rewards score, in [0, 1]) and ``seeds``, named by the step,
the rank and the index of the call's first sample within the step. Two launches of the same seed
(e.g. with and without ``[custom.rollout.speed]``) then write files of the same names whose
tensors can be compared (``scripts/speed_defaults_report.py``). Validation rollouts are not
saved. Without a step count (a rollout outside a training loop) only the first call is saved.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from cosmos_sana.log import get_logger

logger = get_logger(__name__)

ROLLOUT_DUMP_ENV = "COSMOS_SANA_ROLLOUT_DUMP"


def dump_name(step: int | None, rank: int, first: int) -> str:
    return f"step{-1 if step is None else step:06d}-rank{rank}-first{first:06d}.safetensors"


class FirstStepDump:
    """Saves the rollout calls of the first step seen (see the module docstring)."""

    def __init__(self, folder: str | Path, rank: int) -> None:
        self.folder = Path(folder)
        self.rank = rank
        self._step: int | None = None
        self._calls = 0

    @classmethod
    def from_env(cls, rank: int) -> FirstStepDump | None:
        folder = os.environ.get(ROLLOUT_DUMP_ENV)
        return cls(folder, rank) if folder else None

    def wants(self, step: int | None) -> bool:
        """Whether the call about to be saved belongs to the first step (counts the call)."""
        self._calls += 1
        if self._calls == 1:
            self._step = step
            return True
        return step is not None and step == self._step

    def save(self, step: int | None, first: int, latents: torch.Tensor, media: torch.Tensor, seeds: list[int]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / dump_name(step, self.rank, first)
        tensors = {
            "latents": latents.detach().to("cpu").contiguous(),
            "media": media.detach().to("cpu").contiguous(),
            "seeds": torch.tensor(seeds, dtype=torch.int64),
        }
        save_file(tensors, str(path))
        logger.info("rollout dump: %d samples of step %s written to %s", len(seeds), step, path)
        return path
