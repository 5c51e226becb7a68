"""The ``sana`` rollout's side of asynchronous reward scoring (``[custom.reward_runtime] mode = "async"``).

Each chunk of media (``[rollout] n_generation_mini_batch`` samples) is submitted to the
process's shared scheduler as soon as it is decoded, so its scoring runs beside the
generation of the next chunk and beside cosmos-rl's own work up to its reward call.
``finish`` tags each payload's prompt with its samples' ids in generation order, the order
in which cosmos-rl hands the completions to the reward function (see
:mod:`cosmos_sana.rewards.ledger`).

Sample ids read ``rollout<call>/<payload>/<sample>@prompt<prompt_idx>``: unique in the process,
and naming the dataset prompt in any error.
"""

from __future__ import annotations

from typing import Any

from cosmos_sana.compat.cosmos_rl import tag_payload_prompt
from cosmos_sana.payload_prompt import parse_prompt
from cosmos_sana.rewards import ledger
from cosmos_sana.rewards.scheduler import RewardScheduler


class RewardSubmission:
    """One rollout call's ``len(payloads) × n`` samples (prompt-major), submitted chunk by chunk."""

    def __init__(self, scheduler: RewardScheduler, payloads: list[Any], n: int, *, timed: bool = True) -> None:
        self.scheduler = scheduler
        self.timed = timed  # waits for these scores count as the training step's reward_wait
        self.call = ledger.LEDGER.next_call()
        self.ids = [
            [f"rollout{self.call}/{i}/{j}@prompt{getattr(p, 'prompt_idx', i)}" for j in range(n)]
            for i, p in enumerate(payloads)
        ]
        items = [parse_prompt(p.prompt, f"payload {getattr(p, 'prompt_idx', i)}") for i, p in enumerate(payloads)]
        self._flat = [s for ids in self.ids for s in ids]
        self._prompts = [text for text, _ in items for _ in range(n)]
        self._metadata = [meta for _, meta in items for _ in range(n)]
        self._submitted = 0

    def on_chunk(self, start: int, output: Any) -> None:
        """``sample_in_chunks`` callback: rows ``[start, start + len)`` are decoded."""
        self._submit(start, output.media)

    def finish(self, payloads: list[Any], results: list[Any], media: Any) -> None:
        """Submit any rows no chunk callback covered and tag the prompts with their ids."""
        if self._submitted < len(self._flat):
            self._submit(self._submitted, media[self._submitted :])
        for payload, result, ids in zip(payloads, results, self.ids, strict=True):
            if len(result.completions) != len(ids):
                raise RuntimeError(
                    f"rollout{self.call}: payload {getattr(payload, 'prompt_idx', '?')} has "
                    f"{len(result.completions)} completions for its {len(ids)} samples {ids}"
                )
            tag_payload_prompt(payload, ids)

    def _submit(self, start: int, media: Any) -> None:
        if start != self._submitted:
            raise RuntimeError(f"rollout{self.call}: chunk at row {start}, expected row {self._submitted}")
        stop = start + media.shape[0]
        ledger.LEDGER.submit(
            self.scheduler, f"rollout{self.call}/rows{start}-{stop}", self._flat[start:stop], media,
            self._prompts[start:stop], self._metadata[start:stop], timed=self.timed,
        )
        self._submitted = stop
