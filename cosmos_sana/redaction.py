"""Keep secrets out of logs, dumped configs and manifests.

A secret is the value of an environment variable whose name looks secret
(TOKEN, KEY, SECRET, PASSWORD, HF_TOKEN, WANDB_API_KEY, AWS_*, NGC_*, GITHUB_TOKEN…).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

SECRET_NAME = re.compile(
    r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)|^(AWS_|NGC_|HF_TOKEN|WANDB_API_KEY|GITHUB_TOKEN)",
    re.IGNORECASE,
)
#: config keys whose string values are secrets (whole words: ``hf_token``, ``wandb_api_key``;
#: not ``tokenizer``, ``score_key`` or ``max_tokens``)
SECRET_KEY = re.compile(
    r"(^|_)(token|api_key|apikey|secret|secret_key|access_key|private_key|password|passwd|credentials?)$",
    re.IGNORECASE,
)
MASK = "***"
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary words


def is_secret_name(name: str) -> bool:
    """Environment variable names whose values are secrets."""
    return bool(SECRET_NAME.search(name))


def is_secret_key(name: str) -> bool:
    """Config keys whose (string) values are secrets."""
    return bool(SECRET_KEY.search(name))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-looking variables, longest first (so substrings mask last)."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    for value in secret_values(environ):
        text = text.replace(value, MASK)
    return text


def redact(obj: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of a config-like structure with secret keys and secret values masked."""
    if isinstance(obj, Mapping):
        return {
            k: (MASK if isinstance(k, str) and isinstance(v, str) and v and is_secret_key(k) else redact(v, environ))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, environ) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj, environ)
    return obj
