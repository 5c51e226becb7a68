"""The one recipe TOML reader: each unreadable recipe is a ConfigInvalid naming the file, at every site."""

from __future__ import annotations

import sys

import pytest

from cosmos_sana.compat import autoload
from cosmos_sana.config.recipe_file import ConfigInvalid, read_toml


def test_reads_a_recipe(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[custom]\npackage = "cosmos-sana"\n[train]\nepoch = 2\n')
    assert read_toml(path) == {"custom": {"package": "cosmos-sana"}, "train": {"epoch": 2}}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.toml", "<file>: no such file"),
        (lambda d: d, "<file>: is a folder; give the recipe's .toml file"),
        (lambda d: (d / "r.toml").write_bytes(b"\x89PNG\r\n") and d / "r.toml", "<file>: not a text file (byte 0 is not UTF-8)"),
        (lambda d: (d / "r.toml").write_text("[train\n") and d / "r.toml", "<toml>: not valid TOML: "),
    ],
    ids=["missing", "folder", "binary", "bad-toml"],
)
def test_unreadable_recipe_is_named(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ConfigInvalid) as caught:
        read_toml(path)
    assert str(caught.value).startswith(f"{path}: {message}")
    assert caught.value.source == str(path)


def test_autoload_reads_with_it_and_leaves_unreadable_recipes_to_cosmos_rl(tmp_path):
    ours = tmp_path / "ours.toml"
    ours.write_text('[custom]\npackage = "cosmos-sana"\n')
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe")
    assert autoload.config_wants_cosmos_sana(str(ours))
    assert not autoload.config_wants_cosmos_sana(str(binary))
    assert not autoload.config_wants_cosmos_sana(str(tmp_path / "missing.toml"))


def test_controller_names_a_missing_recipe(tmp_path, monkeypatch):
    from cosmos_sana.compat.cosmos_rl import controller_config

    missing = tmp_path / "missing.toml"
    monkeypatch.setattr(sys, "argv", ["controller", "--config", str(missing)])
    with pytest.raises(ConfigInvalid, match=f"{missing}: <file>: no such file"):
        controller_config()
