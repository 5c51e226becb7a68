"""The one parser of cosmos-rl payload prompts (rollout, data packer, RL trainer, reward function)."""

from __future__ import annotations

import pytest

from cosmos_sana.payload_prompt import parse_prompt
from cosmos_sana.rewards import ledger


@pytest.mark.parametrize(
    ("prompt", "text", "metadata"),
    [
        ("a cat", "a cat", {}),  # a bare string (cosmos-rl's own prompt datasets)
        ({"prompt": "a cat", "metadata": {"tag": "animals"}}, "a cat", {"tag": "animals"}),  # prompts-dataset item
        ({"prompt": "a cat", "metadata": None}, "a cat", {}),
        ({"prompt": "a cat", "tag": "x"}, "a cat", {"tag": "x"}),  # a flat record: other keys are metadata
        ({"prompt": "a", "tag": "flat", "metadata": {"tag": "nested"}}, "a", {"tag": "nested"}),  # metadata wins
        (ledger.tagged("a cat", ["s0", "s1"]), "a cat", {}),  # the sample-id tag is not metadata
        (ledger.tagged({"prompt": "a", "metadata": {"k": 1}}, ["s0"]), "a", {"k": 1}),
    ],
)
def test_prompt_text_and_metadata(prompt, text, metadata):
    assert parse_prompt(prompt, "payload 0") == (text, metadata)


def test_metadata_is_a_copy():
    item = {"prompt": "a", "metadata": {"k": 1}}
    parse_prompt(item, "payload 0")[1]["k"] = 2
    assert item["metadata"] == {"k": 1}


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ({"text": 1}, r"payload 7: expected a prompt string or \{'prompt': str, 'metadata': dict\}, got \{'text': 1\}"),
        ({"prompt": 3}, r"payload 7: expected a prompt string"),
        (None, r"payload 7: expected a prompt string .*got None"),
        (5, r"payload 7: expected a prompt string .*got 5"),
        ({"prompt": "a", "metadata": ["k"]}, r"payload 7: 'metadata' must be a dict, got list"),
    ],
)
def test_bad_prompt_is_a_type_error_naming_where(prompt, message):
    with pytest.raises(TypeError, match=message):
        parse_prompt(prompt, "payload 7")


def test_rl_batch_reads_rollout_prompts_and_names_a_bad_one():
    from types import SimpleNamespace

    import torch

    from cosmos_sana_plugins.trainers.rl import RolloutBatch

    info = {"x0": torch.zeros(4), "sigmas": torch.zeros(3), "text_embeds": torch.zeros(2, 4), "text_mask": torch.ones(2)}

    def rollout(prompt):
        return SimpleNamespace(prompt=prompt, extra_info=info, report_metrics=None, completion=None, prompt_idx=0, reward=1.0)

    tagged = ledger.tagged({"prompt": "a dog", "metadata": {}}, ["s0"])
    assert RolloutBatch.collate([rollout("a cat"), rollout(tagged)], "cpu").prompts == ["a cat", "a dog"]
    with pytest.raises(TypeError, match=r"rollout 1: expected a prompt string .*'caption'"):
        RolloutBatch.collate([rollout("a cat"), rollout({"caption": "a cat"})], "cpu")
