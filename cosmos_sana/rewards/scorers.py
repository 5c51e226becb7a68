"""Instantiate the configured scorers once and score batches with them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cosmos_sana.config import RewardRef, SanaCustomConfig
from cosmos_sana.plugin_manager import PluginRegistry
from cosmos_sana.rewards.combine import combine
from cosmos_sana.runtime import component_params


@dataclass
class ScorerSet:
    refs: list[RewardRef]
    fns: dict[str, Callable[..., Sequence[float]]]

    @classmethod
    def from_settings(cls, settings: SanaCustomConfig, registry: PluginRegistry, device: Any = None) -> "ScorerSet":
        fns: dict[str, Callable[..., Sequence[float]]] = {}
        for index, ref in enumerate(settings.rewards):
            spec = registry.get("reward", ref.name)
            params = component_params(registry, "reward", ref, f"custom.rewards[{index}]")
            target = spec.load()
            kwargs = params.model_dump() if params is not None else {}
            if spec.factory:
                fns[ref.name] = target(params, device)
            else:
                fns[ref.name] = (lambda fn, kw: lambda media, prompts, meta: fn(media, prompts, meta, **kw))(target, kwargs)
        return cls(list(settings.rewards), fns)

    def score(self, media: Any, prompts: list[str], metadata: list[dict]) -> tuple[list[float], dict[str, list[float]]]:
        components = {name: [float(v) for v in fn(media, prompts, metadata)] for name, fn in self.fns.items()}
        return combine(components, self.refs), components
