"""Non-finite losses and gradients: found before the optimizer step, so no weight ever takes a NaN.

``[custom.trainer] on_non_finite`` decides what happens then: "stop" (default) raises
:class:`NonFiniteStep` naming the step, the loss terms and the first parameter whose gradient is
not finite; "skip" drops that optimizer update, counted in ``train/skipped_updates``. With several
ranks the verdict is agreed over all of them, so they stop or skip together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from cosmos_sana.run_errors import RunStopped


class NonFiniteStep(RunStopped):
    """A training step produced a NaN or infinite loss term or gradient; no weight was changed."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def non_finite_problem(
    grad_norm: torch.Tensor, losses: Mapping[str, Any], named_parameters: Iterable[tuple[str, torch.nn.Parameter]]
) -> str | None:
    """What is not finite in this update, or None: the loss terms ``losses`` (summed over their
    samples) and the total gradient norm ``grad_norm``. One host sync (and one all-reduce of a few
    flags when a process group is running)."""
    names = sorted(losses)
    totals = [torch.as_tensor(losses[n]).detach().float().sum().to(grad_norm.device) for n in names]
    values = torch.stack([_local(grad_norm).detach().float().reshape(()), *totals])
    local = (~torch.isfinite(values)).to(torch.int32)
    flags = local.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    grad_bad, *term_bad = (bool(f) for f in flags.tolist())
    if not grad_bad and not any(term_bad):
        return None
    here = [bool(f) for f in local.tolist()[1:]]
    found = []
    terms = [f"{name!r} = {float(total):g}" if mine else f"{name!r} (on another rank)"
             for name, total, bad, mine in zip(names, totals, term_bad, here) if bad]
    if terms:
        summed = " (summed over this rank's samples)" if any(here) else ""
        found.append(f"non-finite loss term{'s' if len(terms) > 1 else ''} {', '.join(terms)}{summed}")
    if grad_bad:
        first = next((name for name, p in named_parameters
                      if p.grad is not None and not bool(torch.isfinite(_local(p.grad)).all())), None)
        where = f", first in {first!r}" if first else " (on another rank)"
        found.append(f"non-finite gradients (total norm {float(_local(grad_norm)):g}{where})")
    return "; ".join(found)
