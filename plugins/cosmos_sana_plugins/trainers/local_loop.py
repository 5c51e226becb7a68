"""The single-process training loop under the name tests and benches import it by.

The loop itself is :mod:`cosmos_sana.local_run` (what ``cosmos-sana run RECIPE --local`` runs).
"""

from __future__ import annotations

from typing import Any

from cosmos_sana.local_run import build_components, score_payload, train_local

__all__ = ["build_components", "run_local", "score_payload"]


def run_local(config: Any, steps: int, components: tuple[Any, Any] | None = None) -> list[dict[str, Any]]:
    """Train up to step ``steps`` (the schedule's total); returns each step's report."""
    return train_local(config, components, steps=steps)
