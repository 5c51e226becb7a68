"""Run logging beside cosmos-rl's: metrics JSONL, media files, wandb, a progress bar.

Everything lands under ``<train.output_dir>/logs/``: ``metrics.jsonl`` (one JSON object a
step, with its ``wall_time``) and ``media/<tag>/step_<N>_<i>.{png,mp4}``. wandb is used when
``[logging] logger`` lists it and the package imports: cosmos-rl's run is borrowed when one exists (it then
logs the metrics, we add the media), otherwise we start one honouring ``WANDB_MODE``
(``offline`` needs no account). Only rank 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.log import get_logger
from cosmos_sana.media_writer import save_media

logger = get_logger(__name__)


def summarize(name: str, values: Sequence[float]) -> dict[str, float]:
    """``{name}/mean, /std, /min, /max`` (population std) of ``values``."""
    if not values:
        return {}
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    return {
        f"{name}/mean": t.mean().item(),
        f"{name}/std": t.std(unbiased=False).item(),
        f"{name}/min": t.min().item(),
        f"{name}/max": t.max().item(),
    }


class RunLog:
    """Per-step metrics and media of one training run (a no-op off rank 0)."""

    def __init__(
        self,
        output_dir: str | Path,
        *,
        use_wandb: bool = False,
        project: str = "cosmos_sana",
        experiment: str | None = None,
        progress_bar: bool = True,
        media_count: int = 4,
        fps: int = 16,
        rank: int = 0,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.dir = Path(output_dir) / "logs"
        self.active = rank == 0
        self.media_count = media_count
        self.fps = fps
        self._use_wandb = use_wandb
        self._project, self._experiment, self._run_config = project, experiment, run_config
        self._wandb: Any = None
        self._own_run = False
        self._bar: Any = None
        self._progress = progress_bar
        if self.active:
            self.dir.mkdir(parents=True, exist_ok=True)

    # -- wandb (lazy: cosmos-rl may start its run after the trainer is built)
    def _wandb_run(self) -> Any:
        if not (self.active and self._use_wandb):
            return None
        if self._wandb is None:
            try:
                import wandb
            except ImportError:
                logger.warning("[logging] logger lists wandb but it is not installed; logging to files only")
                self._use_wandb = False
                return None
            if wandb.run is None:
                name = self._experiment if self._experiment not in (None, "None") else None
                wandb.init(
                    project=self._project,
                    name=name,
                    dir=str(self.dir),
                    mode=os.environ.get("WANDB_MODE", "offline"),
                    config=dict(self._run_config or {}),
                )
                self._own_run = True
            self._wandb = wandb
        return self._wandb.run

    def log(self, step: int, metrics: Mapping[str, float], total_steps: int | None = None) -> None:
        """Append ``metrics`` for ``step`` to ``metrics.jsonl`` (and wandb when we own the run)."""
        if not self.active:
            return
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
        with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, "wall_time": time.time(), **clean}) + "\n")
        run = self._wandb_run()
        if run is not None and self._own_run:
            run.log(clean, step=step)
        self._advance(step, total_steps, clean)

    def media(
        self,
        step: int,
        tag: str,
        samples: torch.Tensor,
        captions: Sequence[str],
    ) -> list[Path]:
        """Save up to ``media_count`` samples (``B×C×H×W`` or ``B×T×C×H×W``) and log them to wandb."""
        if not self.active or self.media_count == 0:
            return []
        try:  # media are a convenience: a failure here must not end a training run
            paths = [
                save_media(sample, self.dir / "media" / tag / f"step_{step:06d}_{i}", self.fps)
                for i, sample in enumerate(samples[: self.media_count])
            ]
            run = self._wandb_run()
            if run is not None:
                kind = self._wandb.Image if paths and paths[0].suffix == ".png" else self._wandb.Video
                run.log({f"media/{tag}": [kind(str(p), caption=c) for p, c in zip(paths, captions)], "media_step": step})
        except Exception as exc:
            logger.warning("step %d: could not log %s media (%s: %s); training goes on", step, tag, type(exc).__name__, exc)
            return []
        return paths

    def _advance(self, step: int, total: int | None, metrics: Mapping[str, float]) -> None:
        if not self._progress:
            return
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=max(step - 1, 0), desc="train", unit="step", dynamic_ncols=True)
        elif total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix({k: f"{metrics[k]:.4g}" for k in _PROGRESS_KEYS if k in metrics}, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._own_run and self._wandb is not None and self._wandb.run is not None:
            self._wandb.finish()
        self._own_run = False


_PROGRESS_KEYS = ("train/loss", "reward/mean")


def run_log_for(cosmos_config: Any, rank: int = 0) -> RunLog:
    """A :class:`RunLog` from cosmos-rl's ``[logging]`` / ``[train]`` and ``[custom.logging]``."""
    from cosmos_sana.settings import settings_of

    settings = settings_of(cosmos_config)
    logging_cfg = cosmos_config.logging
    return RunLog(
        cosmos_config.train.output_dir,
        use_wandb="wandb" in list(logging_cfg.logger),
        project=logging_cfg.project_name,
        experiment=logging_cfg.experiment_name,
        progress_bar=settings.logging.progress_bar,
        media_count=settings.logging.media_count,
        fps=settings.model.fps,
        rank=rank,
        run_config={"custom": settings.model_dump(mode="json")},
    )
