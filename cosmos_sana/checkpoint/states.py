"""Checkpointable views of training state (``torch.distributed.checkpoint.stateful.Stateful``).

Model and optimizer go through ``torch.distributed.checkpoint.state_dict`` so
keys are parameter FQNs (independent of FSDP wrapping and rank count) and
FSDP2/DTensor shards stay sharded.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_sana.checkpoint.dcp_io import CheckpointError, rank_and_world
from cosmos_sana.seeds import derive_seed, seed_all

#: PEFT puts this in the name of every LoRA tensor (``lora_A``, ``lora_B``, ``lora_magnitude_vector``…).
LORA_KEY_MARK = "lora_"
MODEL_CONFIG_FILE = "config.json"
#: PEFT renames a wrapped layer's own weights ``<layer>.base_layer.<name>``.
BASE_LAYER = ".base_layer"


def is_lora_key(key: str) -> bool:
    return LORA_KEY_MARK in key


def base_key(key: str) -> str:
    """The key a PEFT-wrapped base weight has in the plain (un-wrapped) model."""
    return key.replace(BASE_LAYER, "")


def jsonable(value: Any) -> Any:
    """Configs (PEFT ``LoraConfig.to_dict()``, diffusers configs) as JSON-safe data."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def model_class(module: torch.nn.Module) -> type:
    """The module's own class, not the ``FSDP<Name>`` subclass ``fully_shard`` swaps in."""
    from torch.distributed.fsdp import FSDPModule

    return next(cls for cls in type(module).__mro__ if not issubclass(cls, FSDPModule))


class ModelState(Stateful):
    """A model's weights: all of them, or (``lora_only``) every PEFT LoRA adapter it holds.

    With ``lora_only`` the frozen base weights are not written (they come from
    the base pipeline) but every adapter is, trained (``default``) or not (``old``).
    ``base_pipeline`` records which pipeline folder the weights belong to, for export.
    """

    def __init__(self, module: torch.nn.Module, *, lora_only: bool = False, base_pipeline: str | None = None):
        self.module = module
        self.lora_only = lora_only
        self.base_pipeline = base_pipeline
        if lora_only and not getattr(module, "peft_config", None):
            raise ValueError(f"{model_class(module).__name__} has no PEFT adapters but lora_only=True")

    def _wanted(self, key: str) -> bool:
        return is_lora_key(key) or not self.lora_only

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in get_model_state_dict(self.module).items() if self._wanted(k)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        result = set_model_state_dict(self.module, state_dict, options=StateDictOptions(strict=False))
        missing = [k for k in result.missing_keys if self._wanted(k)]
        if result.unexpected_keys or missing:
            raise CheckpointError(
                f"model weights do not match {model_class(self.module).__name__}: "
                f"missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]}"
            )

    def describe(self) -> dict[str, Any]:
        """What export needs to rebuild the model (written to the checkpoint's ``meta.json``)."""
        peft_config = getattr(self.module, "peft_config", None) or {}
        trainable = sorted(
            adapter
            for adapter in peft_config
            if any(p.requires_grad and f".{adapter}." in f"{name}." for name, p in self.module.named_parameters())
        )
        return {
            "class": model_class(self.module).__name__,
            "lora_only": self.lora_only,
            "base_pipeline": self.base_pipeline,
            "adapters": {name: jsonable(cfg.to_dict()) for name, cfg in peft_config.items()},
            "trainable_adapters": trainable,
        }

    def write_config(self, folder: Path) -> None:
        """The model's diffusers ``config.json`` (``from_config`` rebuilds the architecture)."""
        to_json_string = getattr(self.module, "to_json_string", None)
        if to_json_string is None:
            return
        config = {**json.loads(to_json_string()), "_class_name": model_class(self.module).__name__}
        (folder / MODEL_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


class OptimizerState(Stateful):
    """Optimizer state keyed by parameter FQN (loads onto any sharding of the same model).

    ``optimizer`` may be one optimizer or several over disjoint parameters.
    """

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer]):
        self.module = module
        self.optimizer = optimizer if isinstance(optimizer, torch.optim.Optimizer) else tuple(optimizer)

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.module, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.module, self.optimizer, state_dict)


def _rank_key(rank: int) -> str:
    return f"rank_{rank}"


class RNGState(Stateful):
    """Python, NumPy, torch CPU and (current device) CUDA generators of this rank.

    Stored per rank as tensors only. A rank the checkpoint has no state for (more
    ranks than at save time) is seeded from ``fallback_seed`` and its rank instead.
    """

    def __init__(self, fallback_seed: int = 0, cuda: Callable[[], bool] = torch.cuda.is_available):
        self.fallback_seed = fallback_seed
        self._cuda = cuda

    @property
    def key(self) -> str:
        return _rank_key(rank_and_world()[0])

    def state_dict(self) -> dict[str, Any]:
        version, mt_state, gauss = random.getstate()
        np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
        if np_name != "MT19937":
            raise CheckpointError(f"unsupported NumPy generator {np_name}")
        cuda = torch.cuda.get_rng_state() if self._cuda() else torch.empty(0, dtype=torch.uint8)
        return {
            self.key: {
                "python_mt": torch.tensor(mt_state, dtype=torch.int64),
                "python_version": torch.tensor(version),
                "python_gauss": torch.tensor([0.0 if gauss is None else gauss, gauss is not None], dtype=torch.float64),
                "numpy_mt": torch.from_numpy(np_keys.astype(np.int64)),
                "numpy_misc": torch.tensor([np_pos, np_has_gauss, np_gauss], dtype=torch.float64),
                "torch_cpu": torch.get_rng_state(),
                "torch_cuda": cuda,
            }
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        s = state_dict[self.key]
        gauss_value, has_gauss = s["python_gauss"].tolist()
        random.setstate(
            (int(s["python_version"]), tuple(s["python_mt"].tolist()), gauss_value if has_gauss else None)
        )
        pos, np_has_gauss, np_gauss = s["numpy_misc"].tolist()
        np.random.set_state(("MT19937", s["numpy_mt"].numpy().astype(np.uint32), int(pos), int(np_has_gauss), np_gauss))
        torch.set_rng_state(s["torch_cpu"])
        if self._cuda() and s["torch_cuda"].numel():
            torch.cuda.set_rng_state(s["torch_cuda"])

    def seed_missing_rank(self, step: int) -> None:
        """Deterministic fresh streams for a rank that has no saved state."""
        seed_all(derive_seed(self.fallback_seed, "missing-rank", step, rank_and_world()[0]))
