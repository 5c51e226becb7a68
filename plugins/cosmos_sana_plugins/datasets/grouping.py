"""Grouping ``n_generation`` completions per prompt.

A rollout batch of ``P`` prompts is expanded prompt-major: rows ``[i*n, (i+1)*n)`` belong to
prompt ``i``. (Upstream's rollout slices ``[i:i+n]``, which mixes prompts whenever ``P > 1``.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def group_slices(num_prompts: int, n_generation: int) -> list[slice]:
    """The rows of each prompt in a prompt-major batch."""
    if num_prompts < 0 or n_generation < 1:
        raise ValueError(f"need num_prompts ≥ 0 and n_generation ≥ 1, got {num_prompts}, {n_generation}")
    return [slice(i * n_generation, (i + 1) * n_generation) for i in range(num_prompts)]


def repeat_per_prompt(values: Sequence[T], n_generation: int) -> list[T]:
    """Prompt-major expansion: ``[a, b]`` with ``n=2`` → ``[a, a, b, b]``."""
    if n_generation < 1:
        raise ValueError(f"n_generation must be ≥ 1, got {n_generation}")
    return [value for value in values for _ in range(n_generation)]


def split_groups(batched: Any, num_prompts: int, n_generation: int) -> list[Any]:
    """Cut a prompt-major tensor/list (or None) into one chunk per prompt."""
    if batched is None:
        return [None] * num_prompts
    rows = batched.shape[0] if hasattr(batched, "shape") else len(batched)
    if rows != num_prompts * n_generation:
        raise ValueError(f"expected {num_prompts}×{n_generation} = {num_prompts * n_generation} rows, got {rows}")
    return [batched[rows_of] for rows_of in group_slices(num_prompts, n_generation)]


def split_outputs(outputs: Mapping[str, Any], num_prompts: int, n_generation: int) -> list[dict[str, Any]]:
    """Per-prompt dicts from a dict of prompt-major batched values (every value batched or None)."""
    groups: list[dict[str, Any]] = [{} for _ in range(num_prompts)]
    for name, batched in outputs.items():
        try:
            chunks = split_groups(batched, num_prompts, n_generation)
        except ValueError as exc:
            raise ValueError(f"rollout output {name!r}: {exc}") from exc
        for group, chunk in zip(groups, chunks):
            group[name] = chunk
    return groups
