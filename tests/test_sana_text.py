"""Prompt encoding: CHI wording and truncation, suffix, and parity with a stock pipeline call."""

from __future__ import annotations

import inspect

import pytest
import torch

from cosmos_sana_plugins.sana.text import chi_lines, encode_negative, encode_prompts, pipeline_call_kwargs


@pytest.fixture(scope="module")
def pipe(tiny_image_pipeline_dir):
    from diffusers import SanaPipeline

    return SanaPipeline.from_pretrained(tiny_image_pipeline_dir)


def test_chi_wording_is_the_one_diffusers_ships():
    from diffusers import SanaPipeline, SanaVideoPipeline

    for mode, cls in (("image", SanaPipeline), ("video", SanaVideoPipeline)):
        assert chi_lines(mode) == inspect.signature(cls.__call__).parameters["complex_human_instruction"].default
    assert "video" in chi_lines("video")[0] and "image" in chi_lines("image")[0]
    assert chi_lines("off") is None
    with pytest.raises(ValueError, match="complex_human_instruction"):
        chi_lines("audio")


def test_chi_keeps_bos_and_the_last_positions(pipe):
    length = 12
    text = encode_prompts(pipe, ["A Red Cube"], chi="image", max_sequence_length=length)
    assert text.embeds.shape == (1, length, 32) and text.mask.shape == (1, length)
    # By hand: the encoder sees CHI + lower-cased prompt padded to n_chi + length − 2 tokens;
    # SANA keeps position 0 (BOS) and the last length − 1 positions.
    chi = "\n".join(chi_lines("image"))
    total = len(pipe.tokenizer.encode(chi)) + length - 2
    tokens = pipe.tokenizer([chi + "a red cube"], padding="max_length", max_length=total, truncation=True,
                            return_tensors="pt")
    with torch.no_grad():
        states = pipe.text_encoder(tokens.input_ids, attention_mask=tokens.attention_mask)[0]
    keep = [0, *range(total - length + 1, total)]
    assert tokens.input_ids[0, 0] == pipe.tokenizer.bos_token_id
    torch.testing.assert_close(text.embeds, states[:, keep])
    assert torch.equal(text.mask, tokens.attention_mask[:, keep])


def test_without_chi_the_prompt_is_padded_to_max_length(pipe):
    text = encode_prompts(pipe, ["a cat", "a big red dog"], max_sequence_length=32)
    lengths = text.mask.sum(1).tolist()
    assert text.embeds.shape[:2] == (2, 32) and lengths[0] < lengths[1] < 32
    assert text.mask[0, lengths[0]:].sum() == 0  # right padding


def test_suffix_is_appended_before_encoding(pipe):
    with_suffix = encode_prompts(pipe, ["a cat"], suffix=" motion score: 30.", max_sequence_length=16)
    spelled_out = encode_prompts(pipe, ["a cat motion score: 30."], max_sequence_length=16)
    torch.testing.assert_close(with_suffix.embeds, spelled_out.embeds)


def test_stock_pipeline_call_kwargs_reproduce_the_encoding(pipe):
    ours = encode_prompts(pipe, ["a red cube"], chi="image", max_sequence_length=12)
    kwargs = pipeline_call_kwargs("image", 12)
    embeds, mask, _, _ = pipe.encode_prompt(["a red cube"], do_classifier_free_guidance=False, **kwargs)
    torch.testing.assert_close(ours.embeds, embeds)
    assert torch.equal(ours.mask, mask)


def test_negative_prompt_never_gets_the_prefix(pipe):
    negative = encode_negative(pipe, 3, max_sequence_length=12)
    plain = encode_prompts(pipe, [""], chi="off", max_sequence_length=12)
    assert negative.embeds.shape == (3, 12, 32)
    torch.testing.assert_close(negative.embeds[2], plain.embeds[0])


def test_bad_prompts_are_rejected(pipe):
    with pytest.raises(TypeError, match="sequence of str"):
        encode_prompts(pipe, "a cat")
    with pytest.raises(ValueError, match="no prompts"):
        encode_prompts(pipe, [])
