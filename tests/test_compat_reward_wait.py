"""``patch_blocking_reward_wait``: cosmos-rl's blocking reward report waits on the reward task
instead of polling it without pause (which starves the scoring threads of the GIL)."""

from __future__ import annotations

import inspect
import threading
from concurrent.futures import Future
from queue import Queue
from types import SimpleNamespace

from cosmos_sana.compat import cosmos_rl as compat


class CountingQueue(Queue):
    """A task queue that counts how often the dispatcher looks at it (one look per poll)."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def empty(self) -> bool:
        self.looks += 1
        return super().empty()


def _dispatcher_with_pending_task(result: tuple, after_s: float):
    from cosmos_rl.reward.dispatcher import RewardDispatcher

    dispatcher = RewardDispatcher()
    dispatcher.is_remote = False  # local reward functions, as set up for the SANA recipes
    dispatcher.task_queue = CountingQueue()
    task: Future = Future()
    dispatcher.task_queue.put(task)
    timer = threading.Timer(after_s, task.set_result, args=(result,))
    timer.start()
    return dispatcher, timer


def test_upstream_blocking_report_polls_the_dispatcher():
    """The contract the patch relies on: the colocated loop reports with ``block=True``, the
    rollout class it uses inherits ``report_rollouts(self, block=False)``, which loops on
    ``dequeue_rewards_cal(self)``; a local task is a Future at the head of ``task_queue``."""
    from cosmos_rl.colocated import rl_worker
    from cosmos_rl.reward.dispatcher import RewardDispatcher
    from cosmos_rl.rollout.worker.colocated.rollout_control import ColocatedRolloutControlWorker
    from cosmos_rl.rollout.worker.rollout_control import DisaggregatedRolloutControlWorker

    assert "self.rollout.report_rollouts(block=True)" in inspect.getsource(rl_worker)
    assert "report_rollouts" not in ColocatedRolloutControlWorker.__dict__
    report = inspect.unwrap(DisaggregatedRolloutControlWorker.report_rollouts)
    assert list(inspect.signature(report).parameters) == ["self", "block"]
    assert "self.reward_dispatcher.dequeue_rewards_cal()" in inspect.getsource(report)
    dequeue = inspect.unwrap(RewardDispatcher.dequeue_rewards_cal)
    assert list(inspect.signature(dequeue).parameters) == ["self"]
    source = inspect.getsource(dequeue)
    assert "self.task_queue.queue[0].done()" in source and "self.is_remote" in source


def test_blocking_report_waits_on_the_task_instead_of_spinning():
    from cosmos_rl.rollout.worker.rollout_control import DisaggregatedRolloutControlWorker

    compat.patch_blocking_reward_wait()
    compat.patch_blocking_reward_wait()  # idempotent
    done = ([], True, 7)  # a validation result: report_rollouts returns it at once
    dispatcher, timer = _dispatcher_with_pending_task(done, after_s=0.35)
    worker = SimpleNamespace(reward_dispatcher=dispatcher)
    payloads, is_validation, step, empty = DisaggregatedRolloutControlWorker.report_rollouts(worker, block=True)
    timer.join()
    assert (payloads, is_validation, step, empty) == ([], True, 7, False)
    # upstream polls ~10^5-10^6 times in 0.35 s; waiting ≤ 0.1 s a poll leaves a handful
    assert 2 <= dispatcher.task_queue.looks <= 12, dispatcher.task_queue.looks
    assert not getattr(compat._blocking_report, "active", False)


def test_non_blocking_dequeue_still_answers_not_ready():
    compat.patch_blocking_reward_wait()
    dispatcher, timer = _dispatcher_with_pending_task(([], True, 1), after_s=0.2)
    assert dispatcher.dequeue_rewards_cal() == (None, False, -1, False)
    assert dispatcher.task_queue.looks == 1
    timer.join()
    assert dispatcher.dequeue_rewards_cal() == ([], True, 1, False)
