"""What ``cosmos-sana data check`` reports about a dataset: counts, histograms, every bad sample."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cosmos_sana_plugins.datasets.errors import BadSample

#: upper edges (seconds) of the duration histogram's bins; the last bin is open
DURATION_EDGES = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
TOP_RESOLUTIONS = 10


def duration_bin(seconds: float) -> str:
    lower = 0.0
    for upper in DURATION_EDGES:
        if seconds < upper:
            return f"{lower:g}-{upper:g}s"
        lower = upper
    return f">={lower:g}s"


@dataclass
class DataReport:
    dataset: str
    on_bad_sample: str
    counts: Counter = field(default_factory=Counter)  # "layout/modality" → good samples
    resolutions: Counter = field(default_factory=Counter)  # "WxH" of the source media
    durations: Counter = field(default_factory=Counter)  # duration_bin → videos
    bad: list[BadSample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the dataset as a whole is unusable (no sample at all)

    @property
    def good(self) -> int:
        return sum(self.counts.values())

    @property
    def fails(self) -> bool:
        """True when a run would stop: a dataset-level problem, or a bad sample under ``fail``."""
        return bool(self.problems) or (bool(self.bad) and self.on_bad_sample == "fail")

    def add_media(self, layout: str, modality: str, height: int, width: int, duration: float | None) -> None:
        self.counts[f"{layout}/{modality}"] += 1
        self.resolutions[f"{width}x{height}"] += 1
        if duration is not None:
            self.durations[duration_bin(duration)] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "on_bad_sample": self.on_bad_sample,
            "good": self.good,
            "bad": len(self.bad),
            "counts": dict(sorted(self.counts.items())),
            "resolutions": dict(self.resolutions.most_common()),
            "durations": {k: self.durations[k] for k in _duration_order() if k in self.durations},
            "bad_samples": [{"where": b.where, "reason": b.reason} for b in self.bad],
            "problems": list(self.problems),
            "verdict": "FAIL" if self.fails else "OK",
        }

    def render(self) -> str:
        lines = [f"{self.dataset}: {self.good} good, {len(self.bad)} bad (on_bad_sample={self.on_bad_sample})"]
        for name, count in sorted(self.counts.items()):
            lines.append(f"  {name}: {count}")
        if self.resolutions:
            lines.append("  resolutions (WxH):")
            for name, count in self.resolutions.most_common(TOP_RESOLUTIONS):
                lines.append(f"    {name}: {count}")
            rest = sum(self.resolutions.values()) - sum(c for _, c in self.resolutions.most_common(TOP_RESOLUTIONS))
            if rest:
                lines.append(f"    (other sizes): {rest}")
        if self.durations:
            lines.append("  durations:")
            lines.extend(f"    {k}: {self.durations[k]}" for k in _duration_order() if k in self.durations)
        for bad in self.bad:
            lines.append(f"  BAD {bad}")
        lines.extend(f"  ERROR {problem}" for problem in self.problems)
        if self.bad or self.problems:
            verdict = "a run would FAIL" if self.fails else f"a run would skip {len(self.bad)} sample(s)"
            lines.append(f"  verdict: {verdict}")
        return "\n".join(lines)


def _duration_order() -> list[str]:
    return [duration_bin(edge - 1e-9) for edge in DURATION_EDGES] + [duration_bin(DURATION_EDGES[-1])]
