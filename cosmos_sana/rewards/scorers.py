"""Build the ``[[custom.rewards]]`` scorers once and score batches with them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosmos_sana.config import RewardRef, SanaCustomConfig
from cosmos_sana.plugin_manager import PluginRegistry
from cosmos_sana.rewards.combine import check_scores, combine
from cosmos_sana.rewards.video import score_video_frames
from cosmos_sana.settings import component_params
from cosmos_sana.specs import RewardSpec

ScoreFn = Callable[[Any, list[str], list[dict]], Sequence[float]]


class MediaError(ValueError):
    """Media handed to the scorers is not a float batch in [0, 1] of the right shape."""


@dataclass(frozen=True)
class Scores:
    """Per-sample totals and every component (reward name → per-sample scores)."""

    total: list[float]
    components: dict[str, list[float]]

    def per_sample(self) -> list[dict[str, float]]:
        """``[{"total": …, name: …}, …]`` in sample order."""
        return [
            {"total": t, **{name: values[i] for name, values in self.components.items()}}
            for i, t in enumerate(self.total)
        ]


@dataclass
class Scorer:
    """One configured reward: its spec, its ``[[custom.rewards]]`` entry and its function."""

    ref: RewardRef
    spec: RewardSpec
    fn: ScoreFn

    @property
    def name(self) -> str:
        """The component's name (``label``, else the registered name)."""
        return self.ref.key

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        if media.ndim == 5 and self.spec.modality == "image":
            scores = score_video_frames(
                self.fn, media, prompts, metadata, stride=self.ref.frame_stride, how=self.spec.video_reduce
            )
        elif media.ndim == 4 and self.spec.modality == "video":
            raise MediaError(f"reward {self.name!r} scores videos (B×T×C×H×W); got images {tuple(media.shape)}")
        else:
            scores = self.fn(media, prompts, metadata)
        return check_scores(self.name, scores, media.shape[0])


def instantiate(spec: RewardSpec, params: Any, device: Any) -> ScoreFn:
    """The scoring function of ``spec``: the factory's product, or the plain function with its args bound."""
    target = spec.load()
    if spec.factory:
        return target(params, device)
    kwargs = params.model_dump() if params is not None else {}

    def bound(media: Any, prompts: list[str], metadata: list[dict]) -> Sequence[float]:
        return target(media, prompts, metadata, **kwargs)

    return bound


def as_media_batch(media: Any) -> Any:
    """A float ``B×C×H×W`` / ``B×T×C×H×W`` tensor in [0, 1] (a list of samples is stacked)."""
    import torch

    if isinstance(media, (list, tuple)):
        media = torch.stack([torch.as_tensor(m) for m in media])
    if not isinstance(media, torch.Tensor):
        raise MediaError(f"media must be a tensor or a list of tensors, got {type(media).__name__}")
    if media.ndim not in (4, 5) or media.shape[0] == 0:
        raise MediaError(f"media must be a non-empty B×C×H×W or B×T×C×H×W batch, got shape {tuple(media.shape)}")
    channels = media.shape[-3]
    if channels not in (1, 3):
        raise MediaError(f"media must have 1 or 3 channels in dim -3, got shape {tuple(media.shape)}")
    if not media.is_floating_point():
        raise MediaError(f"media must be float in [0, 1], got dtype {media.dtype}")
    low, high = torch.aminmax(media.detach())
    if low.item() < -1e-3 or high.item() > 1 + 1e-3:
        raise MediaError(f"media must be in [0, 1], got values in [{low.item():.3f}, {high.item():.3f}]")
    if channels == 1:
        media = media.expand(*media.shape[:-3], 3, *media.shape[-2:])
    return media.clamp(0, 1)


@dataclass
class ScorerSet:
    """The configured scorers, in ``[[custom.rewards]]`` order."""

    scorers: list[Scorer] = field(default_factory=list)

    @classmethod
    def build(
        cls, refs: Iterable[RewardRef], registry: PluginRegistry, device: Any = None, where: str = "custom.rewards"
    ) -> "ScorerSet":
        scorers: list[Scorer] = []
        seen: set[str] = set()
        for index, ref in enumerate(refs):
            if ref.key in seen:
                raise ValueError(f"{where}[{index}]: reward {ref.key!r} is configured twice; give one a `label`")
            seen.add(ref.key)
            spec = registry.get("reward", ref.name)
            params = component_params(registry, "reward", ref, f"{where}[{index}]")
            scorers.append(Scorer(ref=ref, spec=spec, fn=instantiate(spec, params, device)))
        if not scorers:
            raise ValueError(f"{where}: no rewards configured; add [[custom.rewards]] entries")
        return cls(scorers)

    @classmethod
    def from_settings(cls, settings: SanaCustomConfig, registry: PluginRegistry, device: Any = None) -> "ScorerSet":
        return cls.build(settings.rewards, registry, device if device is not None else settings.reward_runtime.device)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.scorers]

    @property
    def refs(self) -> list[RewardRef]:
        return [s.ref for s in self.scorers]

    def get(self, name: str) -> Scorer:
        for scorer in self.scorers:
            if scorer.name == name:
                return scorer
        raise KeyError(f"reward {name!r} is not configured here; configured: {', '.join(self.names)}")

    def subset(self, names: Iterable[str]) -> "ScorerSet":
        return ScorerSet([self.get(n) for n in names])

    def score(self, media: Any, prompts: Sequence[str], metadata: Sequence[dict] | None = None) -> Scores:
        """Score a batch with every scorer; the total and each component per sample."""
        media = as_media_batch(media)
        prompts, metadata = check_batch(media.shape[0], prompts, metadata)
        components = {s.name: s(media, prompts, metadata) for s in self.scorers}
        return Scores(combine(components, self.refs), components)


def check_batch(n: int, prompts: Sequence[str], metadata: Sequence[dict] | None) -> tuple[list[str], list[dict]]:
    prompts = list(prompts)
    metadata = [{} for _ in range(n)] if metadata is None else [dict(m or {}) for m in metadata]
    if len(prompts) != n or len(metadata) != n:
        raise MediaError(f"{n} media but {len(prompts)} prompts and {len(metadata)} metadata entries")
    return prompts, metadata
