"""Run a script on two CPU ranks under torchrun (gloo), the way every two-rank test does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: what a rank's stderr holds when it was aborted while tearing down: its peer closed the gloo
#: connection after the last collective, or a communication thread was still joinable at exit
#: (C++ "terminate called without an active exception", seen once in a CI-like run)
_TEARDOWN_ABORT = ("Connection closed by peer", "Connection reset by peer", "terminate called without an active exception")


def _teardown_abort(result: subprocess.CompletedProcess) -> bool:
    text = result.stderr + result.stdout
    return "Signal 6 (SIGABRT)" in text and any(marker in text for marker in _TEARDOWN_ABORT)


def run_two_ranks(script: Path, *args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``script args...`` on two ranks; asserts both exited 0 and returns the finished process.

    ``--standalone`` lets torchrun pick a free rendezvous port itself (a port chosen here and
    released before torchrun binds it can be taken by a parallel test). One rerun is allowed only
    when gloo aborted a rank during teardown; any other failure is reported at once."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0 and _teardown_abort(result):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result
