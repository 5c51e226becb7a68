"""Advantages over the whole step: the rewards of every data-parallel rank, not one rank's share.

flow_grpo's ``train_sd3.py`` and DiffusionNFT's ``train_nft_sd3.py`` gather every GPU's rewards
and prompts before ``PerPromptStatTracker`` normalises them, then keep their own rows. Here each
data-parallel rank of a policy replica gets a slice of the step's rollouts from cosmos-rl, and
the samples of one prompt may sit on several ranks; :func:`step_advantages` gathers the
rewards and prompt indices (cosmos-rl's dataset index, the same on every rank) of the replica's
data-parallel group, so per-prompt groups and the global std cover the whole step, and returns
this rank's rows. Replicas (``n_init_replicas > 1``) normalise their own rollouts.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from cosmos_sana_plugins.trainers import losses


def data_parallel_group(parallel_dims: Any) -> Any | None:
    """The process group of the ranks that get different rollouts (cosmos-rl's ``dp`` mesh),
    or None when this process trains alone (no process group, or no data parallelism)."""
    if not (dist.is_available() and dist.is_initialized()) or parallel_dims is None:
        return None
    mesh = getattr(parallel_dims, "mesh", None)  # set once cosmos-rl's worker builds the mesh
    if not parallel_dims.dp_enabled or mesh is None:
        return None
    return mesh["dp"].get_group()


def gather_rewards(
    rewards: torch.Tensor, group_ids: torch.Tensor, group: Any
) -> tuple[torch.Tensor, torch.Tensor, slice]:
    """Every rank's ``(rewards, group_ids)`` concatenated in rank order, and this rank's rows in them.
    Ranks may hold different numbers of samples."""
    local = (rewards.detach().double().cpu().tolist(), group_ids.cpu().tolist())
    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, local, group=group)
    start = sum(len(r) for r, _ in parts[: dist.get_rank(group)])
    all_rewards = torch.tensor([r for part, _ in parts for r in part], dtype=torch.float64)
    all_ids = torch.tensor([g for _, part in parts for g in part], dtype=torch.long)
    return all_rewards, all_ids, slice(start, start + rewards.numel())


def step_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, *, global_std: bool, ddof: int, group: Any = None
) -> torch.Tensor:
    """:func:`~cosmos_sana_plugins.trainers.losses.group_advantages` over the rollouts of every rank of
    ``group`` (None: this process's rollouts only); this rank's advantages, on ``rewards``' device."""
    if group is None or dist.get_world_size(group) == 1:
        return losses.group_advantages(rewards, group_ids, global_std=global_std, ddof=ddof)
    all_rewards, all_ids, mine = gather_rewards(rewards, group_ids, group)
    adv = losses.group_advantages(all_rewards, all_ids, global_std=global_std, ddof=ddof)
    return adv[mine].to(rewards.device)
