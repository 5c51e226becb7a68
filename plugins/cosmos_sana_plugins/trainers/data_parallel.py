"""How a trainer places its transformer on the data-parallel ranks (``[custom.model] lora_data_parallel``).

``"fsdp"`` (default): cosmos-rl's FSDP2 sharding over the ``dp`` mesh when ``policy.parallelism``
shards (``dp_shard_size`` > 1), with ``train.fsdp_reshard_after_forward`` honoured
(:func:`cosmos_sana.compat.cosmos_rl.parallelize_diffusers`). Each forward all-gathers every
sharded module's weights unless they are still gathered; the backward reduce-scatters the gradients,
by default only in the last backward before each optimizer step for LoRA (``[custom.model]
fsdp_gradient_sync``, :func:`deferred_sync_modules`).

``"replicate"`` (LoRA only): every rank keeps the whole transformer, frozen base and adapters. The
adapters are broadcast from the group's first rank once at start (so every replica starts from the
same weights whatever each rank's random state was), and before each optimizer step the trainable
gradients are averaged over the ``dp`` group in one all-reduce (:func:`average_gradients`). Frozen
weights are never communicated, so sampling and the training forwards run without collectives.
Not torch's ``DistributedDataParallel``: it wraps the module (renaming every parameter) and
all-reduces on every backward, and an RL step runs many backwards per optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from cosmos_sana_plugins.trainers.advantages import data_parallel_group

REPLICATE = "replicate"


def check_placement(config: Any, placement: str) -> None:
    """Refuse ``"replicate"`` for full-parameter training (ValueError naming the key)."""
    if placement == REPLICATE and config.policy.lora is None:
        raise ValueError(
            'custom.model.lora_data_parallel = "replicate" needs LoRA ([policy.lora]): it keeps a whole copy '
            "of the model on every rank and averages only the trainable gradients, which for full-parameter "
            "training means every weight's gradient, optimizer state and copy on every GPU; use \"fsdp\" "
            "(the default), which shards them"
        )


def place_model(model: Any, parallel_dims: Any, config: Any, placement: str) -> Any | None:
    """Shard (``"fsdp"``) or replicate ``model.transformer`` over the data-parallel ranks.

    Returns the process group over which :func:`average_gradients` must average the trainable
    gradients before each optimizer step (``"replicate"`` on several ranks), else None."""
    check_placement(config, placement)
    if placement == REPLICATE:
        group = data_parallel_group(parallel_dims)
        if group is None or dist.get_world_size(group) == 1:
            return None
        from cosmos_sana.checkpoint.states import is_lora_key

        broadcast_parameters([p for name, p in model.transformer.named_parameters() if is_lora_key(name)], group)
        return group
    if parallel_dims is not None and parallel_dims.dp_shard_enabled and parallel_dims.world_size > 1:
        from cosmos_sana.compat.cosmos_rl import parallelize_diffusers

        parallelize_diffusers(model, parallel_dims, config)
    return None


def deferred_sync_modules(transformer: torch.nn.Module, option: str, is_lora: bool) -> list[Any]:
    """The FSDP2 modules of ``transformer`` whose gradient reduce-scatter waits for the last backward
    before each optimizer step (``[custom.model] fsdp_gradient_sync``), or ``[]`` to reduce-scatter
    in every backward (the option says so, or nothing is sharded).

    A training step runs several backwards per optimizer step (SFT: one per micro-batch; RL: one per
    mini-batch and trained timestep). Reduce-scattering each of them costs one collective per sharded
    module and backward; deferred, earlier backwards accumulate full-size (unsharded) gradients on
    every rank and the last one reduce-scatters their sum, once per module. The rank mean of the
    summed gradients is the sum of the per-backward rank means, so the weights train the same. The
    cost is memory: the accumulated gradients are those of every trainable parameter, unsharded, in
    ``fsdp_reduce_dtype``.
    For LoRA that is the adapters' (megabytes), so ``"auto"`` defers; for full-parameter training it
    is the whole model's (6.4 GB in float32 for SANA-1600M, where two ranks shard 3.2 GB each), so
    ``"auto"`` keeps the per-backward reduce-scatter and ``"last_backward"`` opts in.

    Every backward must run through every sharded module (each is one forward of the whole
    transformer): FSDP2 reduces a module's accumulated gradient only in a synced backward that
    reaches it."""
    defer = is_lora if option == "auto" else option == "last_backward"
    if not defer:
        return []
    from torch.distributed.fsdp import FSDPModule

    return [sub for sub in transformer.modules() if isinstance(sub, FSDPModule)]


def set_gradient_sync(modules: list[Any], enabled: bool) -> None:
    """Whether the next backward reduce-scatters the gradients of ``modules`` (FSDP2 modules): False
    accumulates them unsharded, True reduce-scatters them with what earlier backwards accumulated."""
    for module in modules:
        module.set_requires_gradient_sync(enabled, recurse=False)


@torch.no_grad()
def broadcast_parameters(params: list[torch.nn.Parameter], group: Any) -> None:
    """Every rank of ``group`` takes the values of the group's first rank."""
    for param in params:
        dist.broadcast(param.data, group_src=0, group=group)


@torch.no_grad()
def average_gradients(params: list[torch.nn.Parameter], group: Any) -> None:
    """Replace each gradient by its mean over the ranks of ``group``: one all-reduce of the
    gradients flattened into one float32 buffer (FSDP reduces in ``fsdp_reduce_dtype``, float32 by
    default). Parameters without a gradient are skipped; every rank runs the same model code, so
    they are the same on every rank."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat, group=group)  # a sum: gloo has no ReduceOp.AVG
    flat /= dist.get_world_size(group)
    for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(part.view_as(grad))


@torch.no_grad()
def reshard(module: torch.nn.Module) -> None:
    """Free the gathered weights of every FSDP2-sharded submodule of ``module`` (no-op when none is gathered
    or the module is not sharded): with ``train.fsdp_reshard_after_forward = "never"`` gradient-free forwards
    (sampling) leave them gathered, and code that reads or writes parameters (EMA swap, checkpoints) must see
    the sharded ones."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()
