"""Fault injection, secrets: masking only what is shown, never the configuration that runs.

The resolved TOML written by ``cosmos-sana validate --dump`` is the file the launchers run, so it
must equal the recipe with its overrides value for value, whatever the environment holds; error
text and log lines must not show a secret.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import tomllib
from pathlib import Path

import pytest

from cosmos_sana.cli import main
from cosmos_sana.redaction import MASK, is_secret_name, redact, redact_text
from cosmos_sana.validation import load_toml

REPO = Path(__file__).resolve().parents[1]
NFT = REPO / "toml" / "tiny" / "sana-image-nft.toml"
HF_TOKEN = "hf_" + "Q" * 34  # shaped like a real Hugging Face token

#: variables of secret-holding services whose values are not secrets, with values that occur in configs
ORDINARY_ENV = {
    "AWS_PROFILE": "default",
    "AWS_REGION": "us-east-1",
    "NGC_CLI_ORG": "nvidia",
    "NGC_CLI_TEAM": "sana-team",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_TOKEN_PATH": "/home/user/.cache/huggingface/token",
    "SSH_KEY_FILE": "/home/user/.ssh/id_ed25519",
}
SECRET_ENV = {
    "HF_TOKEN": HF_TOKEN,
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEJr//////////wEaDEXAMPLE",
    "NGC_API_KEY": "nvapi-" + "x" * 40,
    "MY_DB_PASSWORD": "correct horse battery",
}


@pytest.mark.fault("contained", guards_data=True)
@pytest.mark.parametrize("variable", sorted(ORDINARY_ENV))
def test_resolved_toml_runs_exactly_what_was_asked(
    variable: str, tiny_image_pipeline_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Masking values of ordinary variables in the dump would change what trains (``AWS_PROFILE=default``
    would turn the LoRA list into ``["***", "old"]``, ``NGC_CLI_ORG=nvidia`` the model path into
    ``…/***/sana``). The dump must equal the recipe with its overrides."""
    for name, value in {**ORDINARY_ENV, **SECRET_ENV}.items():
        monkeypatch.setenv(name, value)
    model = tmp_path / "nvidia" / "sana"  # a path holding the variables' values
    model.parent.mkdir()
    model.symlink_to(tiny_image_pipeline_dir)
    value = ORDINARY_ENV[variable]
    overrides = [f'policy.model_name_or_path="{model}"', f'train.output_dir="{tmp_path / "runs"}"',
                 f'logging.project_name="{value}"']
    dump = tmp_path / "resolved.toml"
    assert main(["validate", str(NFT), "--dump", str(dump), *(a for o in overrides for a in ("--set", o))]) == 0
    resolved = tomllib.loads(dump.read_text())
    assert resolved == load_toml(NFT, overrides)
    assert resolved["policy"]["lora"]["lora_names"] == ["default", "old"]
    assert resolved["policy"]["model_name_or_path"] == str(model)
    assert MASK not in dump.read_text()
    assert stat.S_IMODE(os.stat(dump).st_mode) == 0o600  # it may hold credentials the recipe carries


@pytest.mark.fault("contained")
@pytest.mark.parametrize("name", sorted(ORDINARY_ENV))
def test_ordinary_variables_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)
    assert redact_text(f"value {ORDINARY_ENV[name]}", environ=ORDINARY_ENV) == f"value {ORDINARY_ENV[name]}"


@pytest.mark.fault("contained")
@pytest.mark.parametrize("name", sorted(SECRET_ENV))
def test_secret_variables_are_masked_in_logs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmos_sana.log import RedactingFormatter, get_logger

    monkeypatch.setenv(name, SECRET_ENV[name])
    logger, stream = get_logger("tests.fault_secrets"), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter("%(message)s"))
    logger.addHandler(handler)
    try:
        logger.warning("upload failed with credentials %s", SECRET_ENV[name])
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == f"upload failed with credentials {MASK}\n"


def test_short_values_of_secret_variables_are_not_masked() -> None:
    """Not a fault case: a 3-letter value is no credential, and masking it would garble text."""
    assert redact_text("the cat sat", environ={"SOME_TOKEN": "cat"}) == "the cat sat"


SECRET_AS_VALUE = [
    # (override, why it is invalid); the value is a secret from the environment or token-shaped
    ("train.epoch=$HF_TOKEN", "a token where an integer belongs"),
    ("policy.parallelism.dp_shard_size=$NGC_API_KEY", "an API key where an integer belongs"),
    ('train.train_policy.type="$WANDB_API_KEY"', "a key where a choice belongs"),
    ('custom.trainer.hf_token="$MY_DB_PASSWORD"', "a secret under an unknown key"),
]


@pytest.mark.fault("refused")
@pytest.mark.parametrize(("override", "why"), SECRET_AS_VALUE, ids=[w for _, w in SECRET_AS_VALUE])
def test_secret_given_as_invalid_value_is_not_echoed(
    override: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for name, value in SECRET_ENV.items():
        monkeypatch.setenv(name, value)
    name = override.split("$")[1].rstrip('"')
    secret = SECRET_ENV[name]
    given = override.replace(f"${name}", secret)
    assert main(["validate", str(NFT), "--set", given, "--set", f'train.output_dir="{tmp_path}"']) == 1
    err = capsys.readouterr().err
    assert "INVALID" in err and override.split("=")[0].rsplit(".", 1)[0] in err  # the key (or its table) is named
    assert secret not in err


@pytest.mark.fault("refused")
def test_token_shaped_text_is_masked_without_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["validate", str(NFT), "--set", f"train.epoch={HF_TOKEN}"]) == 1
    err = capsys.readouterr().err
    assert "train.epoch" in err and HF_TOKEN not in err


@pytest.mark.fault("contained")
def test_recorded_configs_mask_secret_keys_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a checkpoint's ``run_config.json`` or an export manifest records is shown, so it is masked."""
    for name, value in {**ORDINARY_ENV, **SECRET_ENV}.items():
        monkeypatch.setenv(name, value)
    config = {"logging": {"wandb_api_key": "literal-in-recipe-1234"},
              "policy": {"lora_names": ["default", "old"], "model_name_or_path": "/data/nvidia/sana"},
              "custom": {"note": f"pushed with {SECRET_ENV['NGC_API_KEY']}"}}
    assert redact(config) == {"logging": {"wandb_api_key": MASK},
                              "policy": {"lora_names": ["default", "old"], "model_name_or_path": "/data/nvidia/sana"},
                              "custom": {"note": f"pushed with {MASK}"}}


@pytest.mark.fault("contained", guards_data=True)
def test_launcher_dry_run_resolves_exactly_with_service_variables_set(
    tiny_image_pipeline_dir: Path, tmp_path: Path
) -> None:
    """End to end: the NFT launcher's dry run with ``AWS_PROFILE=default`` and
    ``NGC_CLI_ORG=nvidia`` set must resolve ``lora_names = ["default", "old"]`` and the model path as given,
    and its log must not hold the token."""
    import subprocess
    import sys

    model = tmp_path / "nvidia" / "sana"
    model.parent.mkdir()
    model.symlink_to(tiny_image_pipeline_dir)
    env = {**os.environ, **ORDINARY_ENV, **SECRET_ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DATASET_PATH": "builtin:demo", "BASE_CHECKPOINT_PATH": str(model), "OUTPUT_ROOT": str(tmp_path / "runs"),
           "NPROC_PER_NODE": "1"}
    script = REPO / "launchers" / "launch_rl_sana-image-nft.sh"
    result = subprocess.run(["bash", str(script), "--dry-run"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "configuration valid" in result.stdout
    run_dir = tmp_path / "runs" / "sana-image-nft"
    resolved = tomllib.loads((run_dir / "sana-image-nft.resolved.toml").read_text())
    assert resolved["policy"]["lora"]["lora_names"] == ["default", "old"]
    assert resolved["policy"]["model_name_or_path"] == str(model)
    assert resolved["custom"]["data"]["args"]["path"] == "builtin:demo"
    log = next((run_dir / "logs").glob("*.log")).read_text()
    assert all(secret not in log + result.stdout + result.stderr for secret in SECRET_ENV.values())


URL_SECRETS = {
    # text shown: what it must become (the password masked, scheme, user, host and path kept)
    "https://alice:s3cr3t-pw@hub.example.com/api": f"https://alice:{MASK}@hub.example.com/api",
    "proxy http://me:pa%40ss@proxy:3128 refused": f"proxy http://me:{MASK}@proxy:3128 refused",
    "postgres://db:hunter2@10.0.0.1:5432/runs": f"postgres://db:{MASK}@10.0.0.1:5432/runs",
    "sk-" + "a" * 40: MASK,
    "ASIA" + "B" * 16: MASK,
}


@pytest.mark.fault("contained")
@pytest.mark.parametrize("text", sorted(URL_SECRETS))
def test_url_passwords_and_token_shapes_are_masked_without_the_environment(text: str) -> None:
    assert redact_text(text, environ={}) == URL_SECRETS[text]


@pytest.mark.parametrize("text", ["http://127.0.0.1:8080/api/reward/pull", "git+ssh://git@github.com/org/repo",
                                  "ftp://anonymous@host/file", "time 12:30@site"])
def test_urls_without_a_password_are_shown_as_given(text: str) -> None:
    """Not a fault case: a port, a user alone or a clock time is no password."""
    assert redact_text(text, environ={}) == text


@pytest.mark.fault("refused")
def test_command_error_lines_are_masked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A command's ``error: …`` line quotes exception text, which may hold a secret (here a path that does)."""
    monkeypatch.setenv("MY_DB_PASSWORD", SECRET_ENV["MY_DB_PASSWORD"])
    missing = f"/nonexistent/{SECRET_ENV['MY_DB_PASSWORD']}/{HF_TOKEN}"
    assert main(["generate", missing, "--prompt", "a cat"]) == 1
    assert capsys.readouterr().err == f"error: /nonexistent/{MASK}/{MASK}: does not exist\n"


@pytest.mark.fault("refused")
def test_usage_errors_are_masked(capsys: pytest.CaptureFixture) -> None:
    """argparse quotes a rejected value: a token pasted into the wrong option stays hidden."""
    with pytest.raises(SystemExit):
        main(["generate", "x", "--prompt", "a cat", "--steps", HF_TOKEN])
    err = capsys.readouterr().err
    assert f"argument --steps: expected a whole number, got '{MASK}'" in err and HF_TOKEN not in err
