"""Fixtures for checkpoint / export / launcher tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def torch_single_thread() -> Iterator[None]:
    """Tiny models run far faster on one intra-op thread than on oversubscribed cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
