"""Secrets from the environment never reach a log line or a dumped config."""

from __future__ import annotations

import io
import logging

import pytest

from cosmos_sana.log import RedactingFormatter, get_logger
from cosmos_sana.redaction import MASK, is_secret_name, redact

FAKE = {
    "HF_TOKEN": "hf_FAKEfakeFAKEfake123",
    "WANDB_API_KEY": "wandb-0123456789abcdef",
    "AWS_SECRET_ACCESS_KEY": "aws/SECRET/value+42",
    "NGC_API_KEY": "ngc-zzzzzzzzzzzz",
    "GITHUB_TOKEN": "ghp_0000111122223333",
    "MY_SERVICE_PASSWORD": "hunter2hunter2",
    "REMOTE_REWARD_TOKEN": "bearer-secret-777",
}


@pytest.fixture
def fake_tokens(monkeypatch):
    for key, value in FAKE.items():
        monkeypatch.setenv(key, value)
    return FAKE


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_ACCESS_KEY_ID", "NGC_API_KEY", "api_key", "db_password"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["HOME", "PATH", "COSMOS_ROLE", "model_name_or_path", "NGC_CLI_ORG", "AWS_PROFILE",
                                  "TOKENIZERS_PARALLELISM", "HF_TOKEN_PATH"])
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_log_lines_are_redacted(fake_tokens):
    logger = get_logger("tests.redaction")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter("%(message)s"))
    logger.addHandler(handler)
    try:
        logger.info("token is %s and key %s", FAKE["HF_TOKEN"], FAKE["WANDB_API_KEY"])
        try:
            raise RuntimeError(f"auth failed with {FAKE['GITHUB_TOKEN']}")
        except RuntimeError:
            logger.exception("upload failed for %s", FAKE["AWS_SECRET_ACCESS_KEY"])
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    for value in FAKE.values():
        assert value not in text
    assert text.count(MASK) >= 4


@pytest.mark.parametrize("key", ["hf_token", "wandb_api_key", "password", "aws_secret_access_key", "secret"])
def test_secret_config_keys(key):
    assert redact({key: "value"}) == {key: MASK}


@pytest.mark.parametrize("key", ["tokenizer", "score_key", "max_tokens", "keep_last", "key_frames", "monkey"])
def test_ordinary_config_keys_survive(key):
    assert redact({key: "value", "table": {key: {"x": 1}}}) == {key: "value", "table": {key: {"x": 1}}}


def test_config_dump_masks_secret_keys_and_values(fake_tokens):
    config = {
        "logging": {"wandb_api_key": "literal-in-config", "project": "p"},
        "custom": {"note": f"uses {FAKE['NGC_API_KEY']}", "items": [FAKE["MY_SERVICE_PASSWORD"], "ok"]},
    }
    clean = redact(config)
    assert clean["logging"] == {"wandb_api_key": MASK, "project": "p"}
    assert clean["custom"]["note"] == f"uses {MASK}"
    assert clean["custom"]["items"] == [MASK, "ok"]


def test_validate_dump_is_the_config_that_runs(fake_tokens, tmp_path, monkeypatch):
    """The dump is run, not shown: a masked value would change the run; it is readable by its owner only."""
    import stat

    from cosmos_sana.cli import main

    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[train]\noutput_dir = "/tmp/{FAKE["HF_TOKEN"]}"\n')
    dump = tmp_path / "dump.toml"
    dump.write_text("")
    dump.chmod(0o644)
    assert main(["validate", str(recipe), "--dump", str(dump)]) == 0
    assert dump.read_text() == f'[train]\noutput_dir = "/tmp/{FAKE["HF_TOKEN"]}"\n'
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600
