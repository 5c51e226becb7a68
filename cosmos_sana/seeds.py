"""Seeds derived from a base seed and a position in the run, never drawn from a running stream.

A resumed run must draw exactly what the uninterrupted run drew at the same step. Anything
taken from a long-lived generator depends on everything drawn before it (validation rounds,
a DataLoader's worker seed, a prefetch), so the rollout's sampling seeds and each training
step's random state are instead a pure function of ``(base seed, what, rank, step, index)``.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

#: seeds lie in [0, SEED_LIMIT): positive and valid for every generator (Python, NumPy, torch)
SEED_LIMIT = 2**31 - 1


def derive_seed(base_seed: int, *position: int | str) -> int:
    """A seed in ``[0, 2**31 - 1)`` that depends only on ``base_seed`` and ``position``
    (blake2b of their text form: stable across processes, platforms and Python versions)."""
    text = ":".join(str(part) for part in (int(base_seed), *position))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_LIMIT


def seed_all(seed: int) -> None:
    """Python, NumPy and torch (CPU and every accelerator) generators from one seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
