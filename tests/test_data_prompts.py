"""RL prompt sets: shipped builtins, .txt, OCR targets, GenEval metadata, bad records; plugin wiring."""

from __future__ import annotations

import json

import pytest

from cosmos_sana.plugin_manager import installed_plugins
from cosmos_sana.runtime import dataset_factory
from cosmos_sana_plugins.datasets.errors import BadSampleError, DatasetError
from cosmos_sana_plugins.datasets.params import PromptDataParams
from cosmos_sana_plugins.datasets.prompts import build_prompts, ocr_target


def _prompts(path, on_bad_sample="fail", **args):
    return build_prompts(PromptDataParams(path=str(path), **args), on_bad_sample=on_bad_sample)


def test_builtin_sets():
    demo, ocr, geneval = _prompts("builtin:demo"), _prompts("builtin:ocr"), _prompts("builtin:geneval")
    assert (len(demo), len(ocr), len(geneval)) == (16, 8, 6)
    assert demo[0] == {"prompt": "A red fox curled up asleep in fresh snow at dawn, soft pink light", "metadata": {}}
    assert ocr[0]["metadata"] == {"ocr_target": "OPEN LATE"}
    assert ocr[7]["metadata"]["ocr_target"] == "The Quiet Engine"
    counting = geneval[2]
    assert counting["prompt"] == "a photo of three apples"
    assert counting["metadata"]["tag"] == "counting"
    assert counting["metadata"]["include"] == [{"class": "apple", "count": 3}]
    assert counting["metadata"]["exclude"] == [{"class": "apple", "count": 4}]


def test_ocr_target_is_the_first_quoted_text():
    assert ocr_target('a sign reading "Hi there" and "ignored"') == "Hi there"
    assert ocr_target("no quotes") is None
    assert ocr_target('empty "" quotes') is None


def test_text_file_skips_blank_lines_and_strips(tmp_path):
    file = tmp_path / "p.txt"
    file.write_text("  first prompt \n\n second\n")
    data = _prompts(file)
    assert [data[i]["prompt"] for i in range(len(data))] == ["first prompt", "second"]


def test_ocr_line_without_target(tmp_path):
    file = tmp_path / "ocr.txt"
    file.write_text('a sign with "EXIT"\na sign with no text\n')
    with pytest.raises(BadSampleError, match=r"ocr\.txt:2: OCR prompt has no target text in double quotes"):
        _prompts(file, format="ocr")
    data = _prompts(file, on_bad_sample="skip", format="ocr")
    assert len(data) == 1 and len(data.policy.skipped) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"tag": "counting", "include": [{"class": "cat", "count": "2"}], "prompt": "two cats"}',
         r"include\[0\]\.count must be int, got str"),
        ('{"tag": "t", "include": {"class": "cat"}, "prompt": "p"}', r"'include' must be list, got dict"),
        ('["a list", "not a record"]', "expected a JSON object, got list"),
        ('{"tag": "t", "include": [{"class": "cat", "count": 1}], "prompt": 3}', "'prompt' must be a string, got int"),
        ('{"tag": "t", "include": [{"class": "cat", "count": 1, "position": ["left of", "0"]}], "prompt": "p"}',
         r"include\[0\]\.position must be \[relation, index\]"),
        ("{not json", "invalid JSON"),
    ],
)
def test_geneval_records_are_validated(tmp_path, line, message):
    file = tmp_path / "g.jsonl"
    good = {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a cat"}
    file.write_text(json.dumps(good) + "\n" + line + "\n")
    with pytest.raises(BadSampleError, match=r"g\.jsonl:2: " + message):
        _prompts(file, format="geneval")
    assert len(_prompts(file, on_bad_sample="skip", format="geneval").policy.skipped) == 1


def test_auto_format_for_jsonl(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "a cat", "style": "photo"}) + "\n")
    assert _prompts(plain)[0] == {"prompt": "a cat", "metadata": {"style": "photo"}}
    geneval = tmp_path / "geneval.jsonl"
    geneval.write_text(json.dumps({"tag": "t", "include": [{"class": "cat", "count": "x"}], "prompt": "p"}) + "\n")
    with pytest.raises(BadSampleError, match="count must be int"):  # detected as geneval, so validated
        _prompts(geneval)


def test_unknown_builtin_and_missing_file(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="unknown builtin prompt set 'nope'"):  # refused with the args
        _prompts("builtin:nope")
    with pytest.raises(DatasetError, match="no such prompt file"):
        _prompts(tmp_path / "absent.txt")


def test_registered_and_built_from_custom_data():
    registry = installed_plugins()
    assert {"images", "videos", "prompts"} <= set(registry.names("dataset"))
    assert "sana" in registry.names("data_packer")
    config = {"custom": {"package": "cosmos-sana",
                         "data": {"name": "prompts", "args": {"path": "builtin:ocr"}, "on_bad_sample": "skip"}}}
    dataset = dataset_factory(registry, "data")(config)
    assert len(dataset) == 8 and dataset.policy.on_bad_sample == "skip"
