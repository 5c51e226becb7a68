"""Reward-hacking guards of the RL step: rollout image statistics as metrics, and ``[custom.guards]`` stops.

:class:`RolloutGuards` turns a step's rollout media into the ``guard/*`` metrics (batch means of
:mod:`~cosmos_sana_plugins.trainers.image_stats`; ``near_constant`` becomes ``near_constant_frac``).
With several ranks the means are taken over every rank's samples, so all ranks see the same
values and stop together. A threshold that is exceeded for ``patience`` consecutive steps
yields a :class:`GuardTripped`, which the trainer raises before the step trains or saves.
"""

from __future__ import annotations

import torch

from cosmos_sana.config.guards import THRESHOLD_KEYS, GuardOptions
from cosmos_sana.log import get_logger
from cosmos_sana.run_errors import RunStopped
from cosmos_sana_plugins.trainers.image_stats import STATISTICS, image_statistics

logger = get_logger(__name__)

METRIC_PREFIX = "guard/"


class GuardTripped(RunStopped):
    """A ``[custom.guards]`` threshold stopped the run."""

    def __init__(self, statistic: str, value: float, threshold: float, step: int, streak: int) -> None:
        self.statistic, self.value, self.threshold, self.step, self.streak = statistic, value, threshold, step, streak
        key = THRESHOLD_KEYS[statistic]
        over = f", above it for {streak} consecutive steps" if streak > 1 else ""
        change = f"{key} or patience" if streak > 1 else key
        super().__init__(
            f"guard: {statistic} = {value:.6g} > {threshold:g} at step {step}{over} "
            f"(set [custom.guards] {change} to change)"
        )


def _metric_name(statistic: str) -> str:
    return METRIC_PREFIX + ("near_constant_frac" if statistic == "near_constant" else statistic)


def _mean_over_ranks(sums: torch.Tensor, count: int) -> torch.Tensor:
    """``sums / count`` over every rank of the default process group (this rank alone without one)."""
    import torch.distributed as dist

    totals = torch.cat([sums, sums.new_tensor([float(count)])])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(totals)
    return totals[:-1] / totals[-1]


class RolloutGuards:
    """Per-step guard metrics and the threshold stops of one trainer."""

    def __init__(self, options: GuardOptions, device: torch.device) -> None:
        self.options = options
        self.device = device  # the collective's device (CUDA under NCCL)
        self.thresholds = options.thresholds()
        self.streaks = dict.fromkeys(self.thresholds, 0)

    def measure(self, media: torch.Tensor | None) -> dict[str, float]:
        """``{guard/<statistic>: batch mean}`` of the rollouts' media (``B×C×H×W`` / ``B×T×C×H×W`` in [0, 1])."""
        if media is None:
            if self.thresholds:
                raise ValueError(
                    f"[custom.guards] sets {sorted(THRESHOLD_KEYS[s] for s in self.thresholds)} but the step's "
                    "rollouts carry no media tensors to measure (use [rollout] backend = \"sana\")"
                )
            return {}
        stats = image_statistics(media, self.options.near_constant_std)
        sums = torch.stack([stats[name].sum() for name in STATISTICS]).to(self.device, torch.float64)
        means = _mean_over_ranks(sums, media.shape[0]).tolist()
        return {_metric_name(name): value for name, value in zip(STATISTICS, means)}

    def check(self, metrics: dict[str, float], step: int) -> GuardTripped | None:
        """Advance the over-threshold streaks with this step's metrics; the stop once a streak reaches ``patience``."""
        tripped = None
        for statistic, threshold in self.thresholds.items():
            value = metrics.get(METRIC_PREFIX + statistic)
            if value is None:
                continue
            self.streaks[statistic] = self.streaks[statistic] + 1 if value > threshold else 0
            if tripped is None and self.streaks[statistic] >= self.options.patience:
                tripped = GuardTripped(statistic, value, threshold, step, self.streaks[statistic])
        if tripped is not None:
            logger.error("%s", tripped)
        return tripped

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The streaks and the thresholds they were counted against, one slot per statistic (both 0
        where no threshold is set: such a slot carries over as a fresh count). A checkpoint part,
        so a resumed run stops at the step the uninterrupted run would."""
        return {
            "streaks": torch.tensor([self.streaks.get(name, 0) for name in STATISTICS], dtype=torch.int64),
            "thresholds": torch.tensor([self.thresholds.get(name, 0.0) for name in STATISTICS], dtype=torch.float64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """A streak carries over where its threshold is unchanged; a changed or newly set threshold
        counts from 0 (the stored steps were over another ceiling)."""
        stored = dict(zip(STATISTICS, zip(state["streaks"].tolist(), state["thresholds"].tolist())))
        self.streaks = {
            name: int(stored[name][0]) if stored[name][1] == threshold else 0 for name, threshold in self.thresholds.items()
        }
