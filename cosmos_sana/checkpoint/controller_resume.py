"""Continue cosmos-rl's RL prompt stream and step count from a cosmos-sana checkpoint.

cosmos-rl's controller owns the prompt stream (its sampler) and the step count, and knows
only its own checkpoints. :class:`SanaControllerResume` is the ``ControllerResumeAdapter``
cosmos-rl 0.4.7 accepts, together with the sampler it restores: an
:class:`~cosmos_sana.sample_order.EpochSampler` seeded with
``train.train_policy.dataloader_seed``, which visits the same order as cosmos-rl's default
``DistributedSampler`` and can be put back mid-epoch.

Where the stream resumes is derived, not read from the controller: the trainer that writes
checkpoints runs in another process and the controller's DataLoader may prefetch. The
trainer counts the prompts behind its completed steps (``consumed_prompts``: per step its
rollouts / ``n_generation`` × policy replicas). The controller's stream is the epoch
permutations one after another (epochs are 1-based), so after C prompts it stands at epoch
``1 + C // N``, position ``C % N`` (N = train-set size). That is a safe replay boundary:
prompts fetched but not yet trained when the run stopped are handed out again, and so are
discarded ones (a conservative rewind; it assumes rollouts are trained in fetch order).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import load_state
from cosmos_sana.checkpoint.layout import resolve_resume, runs_root
from cosmos_sana.log import get_logger
from cosmos_sana.sample_order import EpochSampler

logger = get_logger(__name__)

TRAINER_PART = "trainer"
# The counters a training checkpoint's ``trainer`` part holds: key → the trainer attribute that
# keeps it (``step`` = completed training steps; ``remain_samples_num`` = completions the RL
# controller still had to hand out; ``consumed_prompts`` = prompts behind the completed steps).
TRAINER_COUNTERS: dict[str, str] = {
    "step": "train_step",
    "optimizer_updates": "optimizer_updates",
    "remain_samples_num": "remain_samples_num",
    "consumed_prompts": "consumed_prompts",
}


def counter_tensors(trainer: Any) -> dict[str, torch.Tensor]:
    """The trainer's counters as the ``trainer`` checkpoint part (0-d tensors DCP saves and loads in place)."""
    return {key: torch.tensor(getattr(trainer, attribute)) for key, attribute in TRAINER_COUNTERS.items()}


def restore_counters(trainer: Any, part: dict[str, torch.Tensor]) -> None:
    """Set the trainer's counters from a loaded ``trainer`` part."""
    for key, attribute in TRAINER_COUNTERS.items():
        setattr(trainer, attribute, int(part[key]))


def read_trainer_state(checkpoint: Path) -> dict[str, int]:
    """The trainer's counters in ``<checkpoint>/trainer`` (what :class:`SanaTrainer` saves)."""
    state = {key: torch.tensor(0) for key in TRAINER_COUNTERS}
    load_state(state, checkpoint / TRAINER_PART)
    return {key: int(value) for key, value in state.items()}


def stream_position(consumed_prompts: int, dataset_size: int) -> tuple[int, int]:
    """``(epoch, position)`` of the controller's stream after ``consumed_prompts`` prompts."""
    if dataset_size < 1:
        raise ValueError(f"the controller's train set is empty (size {dataset_size})")
    epochs_done, position = divmod(consumed_prompts, dataset_size)
    return epochs_done + 1, position


@dataclass(frozen=True)
class ResumePoint:
    """Everything the controller needs from one checkpoint."""

    checkpoint: Path
    counters: dict[str, int]
    epoch: int
    sampler_state: dict[str, int]


def find_resume_point(config: Any, dataset_size: int, seed: int) -> ResumePoint | None:
    """The checkpoint ``train.resume`` selects (``true``: the latest complete one in any run folder
    under ``train.output_dir``'s parent; a path: that one, refused unless COMPLETE); None when
    discovery finds nothing."""
    root = runs_root(config.train.output_dir, config.train.timestamp)
    path = resolve_resume(config.train.resume, root)
    if path is None:
        return None
    path = path.absolute()
    counters = read_trainer_state(path)
    epoch, position = stream_position(counters["consumed_prompts"], dataset_size)
    logger.info(
        "controller resumes from %s: step %d, %d prompts consumed → epoch %d, position %d of %d",
        path, counters["step"], counters["consumed_prompts"], epoch, position, dataset_size,
    )
    return ResumePoint(path, counters, epoch, {"seed": seed, "epoch": epoch, "position": position})


class SanaControllerResume:
    """cosmos-rl's ``ControllerResumeAdapter`` over cosmos-sana checkpoints, and the sampler
    factory of the stream it restores (pass both: ``sampler=adapter.make_sampler,
    resume_adapter=adapter``)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.sampler: Any = None

    def make_sampler(self, data_source: Any, *, num_replicas: int = 1, rank: int = 0,
                     shuffle: bool = True, drop_last: bool = False) -> Any:
        """cosmos-rl's sampler factory signature; the controller calls it once per fetcher."""
        self.sampler = EpochSampler(
            data_source, num_replicas=num_replicas, rank=rank, shuffle=shuffle, drop_last=drop_last, seed=self.seed
        )
        return self.sampler

    def load_metadata(self, config: Any) -> Any:
        """``ControllerResumeMetadata`` of the selected checkpoint, or None (fresh start)."""
        if self.sampler is None:
            raise RuntimeError(
                "SanaControllerResume.load_metadata: the controller built no sampler with make_sampler; "
                "pass sampler=adapter.make_sampler together with resume_adapter=adapter"
            )
        from cosmos_rl.dispatcher.data.resume import ControllerResumeMetadata

        point = find_resume_point(config, len(self.sampler), self.seed)
        if point is None:
            return None
        return ControllerResumeMetadata(
            checkpoint_path=str(point.checkpoint),
            checkpoint_id=point.checkpoint.name,
            completed_training_steps=point.counters["step"],
            completed_optimizer_updates=point.counters["optimizer_updates"],
            remaining_completions=point.counters["remain_samples_num"],
            epoch=point.epoch,
            sampling_owner="sampler",
            sampler_state=point.sampler_state,
        )

    def restore_sampler(self, sampler: Any, metadata: Any) -> None:
        """Put the sampler at the metadata's epoch and position (nothing is drawn from it)."""
        if sampler is not self.sampler:
            raise TypeError(
                f"SanaControllerResume.restore_sampler: got a {type(sampler).__name__}, not the sampler "
                "this adapter built (pass sampler=adapter.make_sampler)"
            )
        sampler.load_state_dict(metadata.sampler_state)


def controller_resume_kwargs(config: Any) -> dict[str, Any]:
    """``sampler`` and ``resume_adapter`` for a cosmos-rl ``ControllerDataFetcher`` of ``config``;
    ``{}`` for SFT (cosmos-rl refuses an adapter where the controller does not own sampling)."""
    if config.train.train_policy.type == "sft":
        return {}
    adapter = SanaControllerResume(config.train.train_policy.dataloader_seed)
    return {"sampler": adapter.make_sampler, "resume_adapter": adapter}
