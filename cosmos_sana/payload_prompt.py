"""The prompt of a cosmos-rl ``RLPayload`` / ``Rollout``: one parser for every reader.

The rollout and data packer (prompt text to sample from), the RL trainer (prompts of its
batch), the asynchronous reward submission and the reward function (text and the metadata
scorers see) all read ``payload.prompt`` through :func:`parse_prompt`.

A prompt is a string, or a dict whose ``"prompt"`` is a string: the prompts datasets' items
are ``{"prompt": str, "metadata": dict}``; any other key of the dict is metadata too (a flat
record), except the sample-id tag the asynchronous reward path adds
(:data:`cosmos_sana.rewards.ledger.SAMPLE_IDS_KEY`). Keys of ``"metadata"`` win over
top-level keys of the same name. Anything else (None, a dict without a string ``"prompt"``,
a ``"metadata"`` that is not a dict) is a ``TypeError`` that names where the prompt came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cosmos_sana.rewards.ledger import SAMPLE_IDS_KEY

_NOT_METADATA = ("prompt", "metadata", SAMPLE_IDS_KEY)


def parse_prompt(prompt: Any, where: str) -> tuple[str, dict[str, Any]]:
    """``(text, metadata)`` of a payload prompt; ``where`` names it in errors (e.g. ``"payload 7"``)."""
    if isinstance(prompt, str):
        return prompt, {}
    if isinstance(prompt, Mapping) and isinstance(prompt.get("prompt"), str):
        metadata = prompt.get("metadata")
        if metadata is None:
            metadata = {}
        elif not isinstance(metadata, Mapping):
            raise TypeError(f"{where}: 'metadata' must be a dict, got {type(metadata).__name__}")
        flat = {key: value for key, value in prompt.items() if key not in _NOT_METADATA}
        return prompt["prompt"], {**flat, **metadata}
    raise TypeError(f"{where}: expected a prompt string or {{'prompt': str, 'metadata': dict}}, got {prompt!r:.80}")
