"""The step clock splits a step's wall time into the spans its parts reported."""

from __future__ import annotations

import pytest

from cosmos_sana.step_clock import StepClock


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_split_adds_up_and_resets():
    now = FakeTime()
    clock = StepClock(now)
    clock.add("rollout", started=100.0, ended=103.0)  # opens the step at 100
    clock.add("reward_wait", started=103.0, ended=103.5)
    clock.add("rollout", started=104.0, ended=105.0)
    now.t = 106.0
    clock.add("train", started=105.0)  # ends now
    now.t = 107.0
    assert clock.close_step() == {
        "time/rollout_s": 4.0, "time/reward_wait_s": 0.5, "time/train_s": 1.0, "time/step_s": 7.0, "time/other_s": 1.5,
    }
    # the next step starts where the last one closed, whatever its first span's start
    clock.add("rollout", started=108.0, ended=109.0)
    now.t = 110.0
    report = clock.close_step()
    assert report["time/step_s"] == 3.0 and report["time/rollout_s"] == 1.0 and report["time/other_s"] == 2.0


def test_overlapping_spans_of_a_part_count_once():
    now = FakeTime()
    clock = StepClock(now)
    clock.add("reward_wait", started=100.0, ended=102.0)  # two reward threads waiting side by side
    clock.add("reward_wait", started=101.0, ended=103.0)
    clock.add("reward_wait", started=104.0, ended=104.5)
    now.t = 105.0
    report = clock.close_step()
    assert report["time/reward_wait_s"] == 3.5 and report["time/other_s"] == 1.5


def test_unknown_part_and_empty_step():
    clock = StepClock(FakeTime())
    with pytest.raises(KeyError, match="unknown step part 'sync'"):
        clock.add("sync", 0.0, 1.0)
    assert clock.close_step()["time/step_s"] == 0.0
