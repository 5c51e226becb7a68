"""``[custom.guards]``: stop an RL run whose rollouts drift into a known reward hack.

Every RL step logs ``guard/saturation``, ``guard/high_freq``, ``guard/periodicity`` and
``guard/near_constant_frac`` (batch means of the rollouts' image statistics, defined in
``cosmos_sana_plugins.trainers.image_stats``) whether or not a threshold is set. A threshold
stops the run when its statistic is above it for ``patience`` consecutive steps; each is off
(``None``) by default.

``holdout_rewards`` scores cosmos-rl's validation (``[validation] enable``, every ``freq``
steps, on ``[custom.val_data]`` prompts) with other scorers than ``[[custom.rewards]]``: a
held-out check that the policy is not trained to please.
"""

from __future__ import annotations

from pydantic import Field

from cosmos_sana.config.base import StrictModel
from cosmos_sana.config.reward import RewardRef

#: statistic → the ``[custom.guards]`` key of its threshold
THRESHOLD_KEYS = {
    "saturation": "max_saturation",
    "high_freq": "max_high_freq",
    "periodicity": "max_periodicity",
    "near_constant_frac": "max_near_constant_frac",
}


class GuardOptions(StrictModel):
    max_saturation: float | None = Field(
        default=None, ge=0, le=1, description="stop when the rollouts' mean HSV saturation is above this"
    )
    max_high_freq: float | None = Field(
        default=None, ge=0, le=1,
        description="stop when the mean share of spectral energy above half Nyquist is above this",
    )
    max_periodicity: float | None = Field(
        default=None, ge=0, le=1,
        description="stop when the mean periodicity (grid / stripe / tiling score) is above this",
    )
    max_near_constant_frac: float | None = Field(
        default=None, ge=0, le=1, description="stop when the fraction of near-constant samples is above this"
    )
    near_constant_std: float = Field(
        default=0.02, gt=0, le=1,
        description="a sample is near-constant when its luminance standard deviation (in [0, 1]) is below this",
    )
    patience: int = Field(
        default=1, ge=1, description="consecutive steps a statistic must be above its threshold before the run stops"
    )
    holdout_rewards: list[RewardRef] = Field(
        default_factory=list,
        description="validation ([validation] enable, every [validation] freq steps, [custom.val_data] prompts) is "
        "scored with these reward terms instead of [[custom.rewards]]; empty: the training rewards",
    )

    def thresholds(self) -> dict[str, float]:
        """``{statistic: threshold}`` of the thresholds that are set."""
        return {stat: value for stat, key in THRESHOLD_KEYS.items() if (value := getattr(self, key)) is not None}
