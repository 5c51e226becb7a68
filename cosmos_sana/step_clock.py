"""Where the wall time of one colocated RL step goes: rollout, waiting for rewards, training, the rest.

cosmos-rl runs rollout and training of a colocated replica in one process, so the parts add their
spans to the process-wide :data:`STEP_CLOCK`; the trainer closes the step and logs ``time/*``.
``time/other_s`` is what none of ours covers: cosmos-rl's controller round trips, collectives,
checkpoint writes and reward scoring that was not hidden behind sampling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PARTS = ("rollout", "reward_wait", "train")


class StepClock:
    """Sums of named spans since the last :meth:`close_step`."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._spent = dict.fromkeys(PARTS, 0.0)
        self._step_start: float | None = None

    def now(self) -> float:
        return self._now()

    def add(self, part: str, started: float, ended: float | None = None) -> None:
        """Count ``ended - started`` (``ended`` defaults to now) to ``part``; the first span opens the step."""
        if part not in self._spent:
            raise KeyError(f"unknown step part {part!r}; one of {PARTS}")
        ended = self._now() if ended is None else ended
        with self._lock:
            self._spent[part] += max(ended - started, 0.0)
            if self._step_start is None:
                self._step_start = started

    def close_step(self) -> dict[str, float]:
        """``time/{step,rollout,reward_wait,train,other}_s`` of the step ending now; starts the next."""
        ended = self._now()
        with self._lock:
            start = ended if self._step_start is None else self._step_start
            spent, self._spent = self._spent, dict.fromkeys(PARTS, 0.0)
            self._step_start = ended
        step = ended - start
        report = {f"time/{part}_s": seconds for part, seconds in spent.items()}
        report["time/step_s"] = step
        report["time/other_s"] = max(step - sum(spent.values()), 0.0)
        return report


STEP_CLOCK = StepClock()
