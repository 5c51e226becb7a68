"""Where the wall time of one colocated RL step goes: rollout, waiting for rewards, training, the rest.

cosmos-rl runs rollout and training of a colocated replica in one process, so the parts add their
spans to the process-wide :data:`STEP_CLOCK`; the trainer closes the step and logs ``time/*``.
``time/other_s`` is what none of ours covers: cosmos-rl's controller round trips, collectives,
and checkpoint writes (a step's checkpoint is saved after its row is closed, so it counts in
the next step's ``other_s``). Spans of one part that overlap (reward threads waiting side by
side) count once. Validation rollouts are not counted.

:data:`STEP_CLOCK` is one of the process-wide objects docs/architecture.md lists under
"Trainer–rollout link and process-wide state".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PARTS = ("rollout", "reward_wait", "train")


def covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class StepClock:
    """Named spans since the last :meth:`close_step`."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._spans: dict[str, list[tuple[float, float]]] = {part: [] for part in PARTS}
        self._step_start: float | None = None

    def now(self) -> float:
        return self._now()

    def add(self, part: str, started: float, ended: float | None = None) -> None:
        """Count ``ended - started`` (``ended`` defaults to now) to ``part``; the first span opens the step."""
        if part not in self._spans:
            raise KeyError(f"unknown step part {part!r}; one of {PARTS}")
        ended = self._now() if ended is None else ended
        with self._lock:
            self._spans[part].append((started, max(ended, started)))
            if self._step_start is None:
                self._step_start = started

    def close_step(self) -> dict[str, float]:
        """``time/{step,rollout,reward_wait,train,other}_s`` of the step ending now; starts the next."""
        ended = self._now()
        with self._lock:
            start = ended if self._step_start is None else self._step_start
            spans, self._spans = self._spans, {part: [] for part in PARTS}
            self._step_start = ended
        step = ended - start
        spent = {part: covered(intervals) for part, intervals in spans.items()}
        report = {f"time/{part}_s": seconds for part, seconds in spent.items()}
        report["time/step_s"] = step
        report["time/other_s"] = max(step - sum(spent.values()), 0.0)
        return report


STEP_CLOCK = StepClock()
