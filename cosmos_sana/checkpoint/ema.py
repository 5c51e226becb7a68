"""Exponential moving average of trained parameters, checkpointed by parameter FQN.

The checkpoint part holding it is named ``ema``; its keys are the same FQNs as the
``model`` part, which is what ``cosmos-sana export --ema`` swaps in.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_sana.checkpoint.dcp_io import CheckpointError


class ParameterEMA(Stateful):
    """``shadow ← decay·shadow + (1 − decay)·param`` for every parameter that requires grad."""

    def __init__(self, module: torch.nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self._params = {name: p for name, p in module.named_parameters() if p.requires_grad}
        if not self._params:
            raise ValueError(f"{type(module).__name__} has no trainable parameters to average")
        self.shadow = {name: p.detach().clone() for name, p in self._params.items()}

    @torch.no_grad()
    def update(self) -> None:
        names = list(self._params)
        torch._foreach_lerp_(
            [self.shadow[n] for n in names], [self._params[n].detach() for n in names], 1.0 - self.decay
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        if set(state_dict) != set(self.shadow):
            extra, missing = set(state_dict) - set(self.shadow), set(self.shadow) - set(state_dict)
            raise CheckpointError(f"EMA keys differ: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
        for name, value in state_dict.items():
            if value is not self.shadow[name]:
                self.shadow[name].copy_(value)
