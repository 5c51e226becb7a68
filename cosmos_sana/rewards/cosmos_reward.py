"""The reward function handed to cosmos-rl: scores ``[[custom.rewards]]`` on a completion."""

from __future__ import annotations

from typing import Any

from cosmos_sana.plugin_manager import PluginRegistry
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.settings import settings_of


class CosmosRewardFn:
    """``fn(completion, reference, prompt=..., config=..., **kw) -> (total, components)``."""

    __name__ = "cosmos_sana_reward"

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry
        self._scorers: ScorerSet | None = None

    def scorers(self, cosmos_config: Any) -> ScorerSet:
        if self._scorers is None:
            self._scorers = ScorerSet.from_settings(settings_of(cosmos_config), self.registry)
        return self._scorers

    def __call__(self, completion: Any, reference: Any = None, *, config: Any = None, prompt: Any = None, **kw: Any):
        import torch

        media = completion if isinstance(completion, torch.Tensor) else torch.as_tensor(completion)
        metadata = reference if isinstance(reference, dict) else {"reference": reference}
        total, components = self.scorers(config).score(media.unsqueeze(0), [prompt or ""], [metadata])
        return total[0], {name: values[0] for name, values in components.items()}
