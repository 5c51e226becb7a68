"""Exceptions a training run raises on purpose to stop, with a message that is the whole story.

A trainer or guard that decides the run must end (a reward-hacking threshold crossed, a NaN loss)
raises a subclass of :class:`RunStopped`; ``cosmos-sana run`` prints its message without a
traceback and exits 1. Plugins subclass it so the core can catch them without importing them.
"""

from __future__ import annotations


class RunStopped(RuntimeError):
    """The run stopped deliberately; ``str(exc)`` says why and what setting changes it."""
