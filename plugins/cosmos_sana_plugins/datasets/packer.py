"""``sana``: the cosmos-rl data packer for SANA and SANA-Video (RL and SFT).

* RL rollout: :meth:`SanaDataPacker.get_rollout_input` expands ``P`` prompt items into
  ``P·n`` prompt-major rows; :meth:`SanaDataPacker.rollout_groups` cuts batched rollout
  outputs back into one dict per prompt (rows ``[i·n, (i+1)·n)``).
* RL training: :meth:`SanaDataPacker.get_policy_input` collates ``Rollout`` objects —
  ``extra_info`` tensors stacked, ``advantages`` ``B×1`` and ``rewards`` ``B`` float32,
  ``prompts`` and per-sample ``metadata`` as lists (GenEval metadata is nested, never stacked).
* SFT: items of the ``images``/``videos`` datasets pass through ``sft_process_sample``;
  ``sft_collate_fn`` gives ``{"prompt", "visual", "samples"}`` (``visual`` is upstream's list of
  ``C×H×W`` / ``C×T×H×W`` tensors in [-1, 1], None for cache hits; ``samples`` feeds
  :func:`~cosmos_sana_plugins.datasets.latent_cache.encode_batch`).

Imports cosmos-rl: load it lazily through the plugin's ``DataPackerSpec``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from cosmos_rl.dispatcher.data.packer.base import BaseDataPacker

from cosmos_sana.payload_prompt import parse_prompt
from cosmos_sana_plugins.datasets.grouping import repeat_per_prompt, split_outputs


def collate_rows(rows: Sequence[Mapping[str, Any]], device: torch.device | str | None = None) -> dict[str, Any]:
    """Stack same-keyed per-sample dicts: tensors and numbers → tensors on ``device``, None → None, else lists."""
    if not rows:
        raise ValueError("cannot collate an empty batch")
    keys = list(rows[0])
    for number, row in enumerate(rows):
        if list(row) != keys:
            raise ValueError(f"sample {number} has keys {sorted(row)}, sample 0 has {sorted(keys)}")
    batch: dict[str, Any] = {}
    for key in keys:
        values = [row[key] for row in rows]
        if all(value is None for value in values):
            batch[key] = None
        elif all(isinstance(value, torch.Tensor) for value in values):
            try:
                batch[key] = torch.stack(values).to(device)
            except RuntimeError as exc:
                raise ValueError(f"{key!r}: per-sample tensors differ in shape ({exc})") from exc
        elif all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
            batch[key] = torch.tensor(values, device=device)
        else:
            batch[key] = values
    return batch


class SanaDataPacker(BaseDataPacker):
    """Registered as ``sana``; one packer for rollouts, RL training and SFT."""

    def get_rollout_input(self, payloads: Sequence[Any], n_generation: int = 1) -> tuple[list[str], list[dict]]:
        """Prompt texts and metadata, each repeated ``n_generation`` times, prompt-major."""
        items = [parse_prompt(p.prompt, f"payload {getattr(p, 'prompt_idx', i)}") for i, p in enumerate(payloads)]
        return (repeat_per_prompt([text for text, _ in items], n_generation),
                repeat_per_prompt([metadata for _, metadata in items], n_generation))

    def rollout_groups(self, outputs: Mapping[str, Any], num_prompts: int, n_generation: int) -> list[dict[str, Any]]:
        """One dict per prompt from prompt-major batched rollout outputs."""
        return split_outputs(outputs, num_prompts, n_generation)

    def get_policy_input(self, sample: Sequence[Any], device: torch.device | str | None = None,
                         rollout_output: Any = None, n_ignore_prefix_tokens: int = 0) -> dict[str, Any]:
        """Collate ``Rollout`` objects for the diffusion trainers."""
        rows = []
        for number, rollout in enumerate(sample):
            text, metadata = parse_prompt(rollout.prompt, f"rollout {number}")
            rows.append({**(rollout.extra_info or {}), "prompts": text, "metadata": metadata,
                         "completions": rollout.completion, "rewards": float(rollout.reward),
                         "advantages": float(rollout.advantage)})
        return self.policy_collate_fn(rows, 0, device=device)

    def policy_compute_max_len(self, processed_samples: Sequence[Any]) -> int:
        """Diffusion batches have no token sequences to pad."""
        return 0

    def policy_collate_fn(self, processed_samples: Sequence[Mapping[str, Any]], computed_max_len: int,
                          device: torch.device | str | None = None) -> dict[str, Any]:
        batch = collate_rows(processed_samples, device)
        batch["advantages"] = batch["advantages"].float().reshape(-1, 1)
        batch["rewards"] = batch["rewards"].float()
        return batch

    def sft_process_sample(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        """Items are ready as the dataset made them; check they are SFT items."""
        if isinstance(sample, Mapping) and "prompt" in sample and {"pixels", "encoded"} & set(sample):
            return sample
        where = sample.get("key") if isinstance(sample, Mapping) else type(sample).__name__
        raise TypeError(f"sample {where!r}: expected an images/videos dataset item (prompt + pixels or encoded)")

    def sft_compute_max_len(self, processed_samples: Sequence[Any]) -> int:
        """Diffusion batches have no token sequences to pad."""
        return 0

    def sft_collate_fn(self, sub_batch: Sequence[Mapping[str, Any]], computed_max_len: int = 0,
                       ignore_label_id: int = -100, is_validation: bool = False) -> Any:
        """Training: ``{"prompt", "visual", "samples"}``; validation: one generation request per item."""
        if is_validation:
            return [self._validation_request(item) for item in sub_batch]
        return {"prompt": [item["prompt"] for item in sub_batch],
                "visual": [item.get("pixels") for item in sub_batch],
                "samples": list(sub_batch)}

    def _validation_request(self, item: Mapping[str, Any]) -> dict[str, Any]:
        diffusers = self.config.policy.diffusers
        height, width = diffusers.inference_size
        return {"prompt": parse_prompt(item, "validation item")[0], "height": height, "width": width,
                "inference_step": diffusers.sample.eval_num_steps, "guidance_scale": diffusers.sample.guidance_scale,
                "frames": diffusers.inference_frames}
