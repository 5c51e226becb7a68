"""Fault injection, configuration: a bad recipe value never validates, and the error names its key.

Each case overrides one key of a shipped tiny recipe (``cosmos-sana validate --set``) or breaks the
file itself; ``validate`` (what the launchers run before anything starts) must exit non-zero and
name the key with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_sana.cli import main

NFT = Path(__file__).resolve().parents[1] / "toml" / "tiny" / "sana-image-nft.toml"

BAD_VALUES = {
    # case: (override, key the error names, words of the reason)
    "reward weight nan": ('custom.rewards=[{name="jpeg_incompressibility", weight=nan}]', "custom.rewards.0.weight",
                          "finite"),
    "reward weight inf": ('custom.rewards=[{name="jpeg_incompressibility", weight=inf}]', "custom.rewards.0.weight",
                          "finite"),
    "learning rate nan": ("train.optm_lr=nan", "train.optm_lr", "finite"),
    "learning rate inf": ("train.optm_lr=inf", "train.optm_lr", "finite"),
    "misspelt key": ("policy.diffusers.timestep_fraction=0.5", "policy.diffusers.timestep_fraction",
                     "did you mean 'timesteps_fraction'"),
    "text for a number": ('train.epoch="many"', "train.epoch", "integer"),
    "undocumented dtype": ('train.param_dtype="float8"', "train.param_dtype", "is not one of"),
    "unknown [custom] key": ("custom.trainer.bogus=1", "custom.trainer.bogus", "Extra inputs"),
    "unknown non-finite policy": ('custom.trainer.on_non_finite="ignore"', "custom.trainer.on_non_finite", "'stop'"),
    "unknown reward": ('custom.rewards=[{name="no_such_reward"}]', "custom.rewards[0]", "no_such_reward"),
}


@pytest.mark.fault("refused")
@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_value_is_refused_naming_the_key(case: str, capsys: pytest.CaptureFixture) -> None:
    override, key, words = BAD_VALUES[case]
    assert main(["validate", str(NFT), "--no-path-check", "--set", override]) == 1
    err = capsys.readouterr().err
    line = next((line for line in err.splitlines() if f": {key}" in line), None)
    assert line is not None and words in line, err
    assert "INVALID" in err


BAD_FILES = {
    # case: (recipe text, or None for no file; words of the error)
    "missing file": (None, "no such file"),
    "not TOML": ("[train\nepoch = 1\n", "line 1"),
    "no [train] table": ('[custom]\npackage = "cosmos-sana"\n', "train: missing table"),
    "train not a table": ('train = 5\n[custom]\npackage = "cosmos-sana"\n', "train: 5 must be a table"),
}


@pytest.mark.fault("refused")
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_recipe_file_is_refused(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text, words = BAD_FILES[case]
    recipe = tmp_path / "recipe.toml"
    if text is not None:
        recipe.write_text(text)
    assert main(["validate", str(recipe), "--no-path-check"]) == 1
    err = capsys.readouterr().err
    assert str(recipe) in err and words in err, err


@pytest.mark.fault("refused")
def test_malformed_override_is_refused(capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", str(NFT), "--no-path-check", "--set", "no-equals-sign"]) == 2
    assert "must look like key.path=value" in capsys.readouterr().err
