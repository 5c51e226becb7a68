"""Keep secrets out of what is shown: log lines, error messages, recorded configs and manifests.

Masking is for display only. A file that is run (the launcher's resolved TOML) keeps every
value as given: masking a path or a list entry there would change what trains.

Secrets are:

* values of environment variables whose name has a secret word (``HF_TOKEN``,
  ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``NGC_API_KEY``,
  ``MY_DB_PASSWORD``…) and at least :data:`MIN_SECRET_LEN` characters. Other variables of
  the same services (``AWS_PROFILE=default``, ``NGC_CLI_ORG=nvidia``,
  ``TOKENIZERS_PARALLELISM=false``) and ``…_PATH``/``…_FILE``/``…_DIR`` locations are not;
* string values of config keys that name a secret (``hf_token``, ``wandb_api_key``);
* text shaped like a well-known access token (``hf_…``, ``ghp_…``, ``nvapi-…``, ``sk-…``,
  ``AKIA…``/``ASIA…``), wherever it appears;
* the password of a URL (``https://user:PASSWORD@host``, ``REMOTE_REWARD_ENQUEUE_URL``,
  ``HTTPS_PROXY``), wherever it appears; the user name stays.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: words (``_``-separated, any case) that make an environment variable's value a secret
SECRET_WORDS = frozenset({
    "TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS",
})
#: last words of variables that name where a secret is, not the secret
LOCATION_WORDS = frozenset({"PATH", "FILE", "DIR", "URL"})
#: config keys whose string values are secrets (whole words: ``hf_token``, ``wandb_api_key``;
#: not ``tokenizer``, ``score_key`` or ``max_tokens``)
SECRET_KEY = re.compile(
    r"(^|_)(token|api_key|apikey|secret|secret_key|access_key|private_key|password|passwd|credentials?)$",
    re.IGNORECASE,
)
#: access tokens recognisable by their shape (Hugging Face, GitHub, NVIDIA NGC, OpenAI-style ``sk-``,
#: AWS long-term and temporary access key ids)
TOKEN_SHAPES = re.compile(
    r"\b(hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|nvapi-[A-Za-z0-9_-]{30,}|sk-[A-Za-z0-9_-]{30,}|(AKIA|ASIA)[0-9A-Z]{16})\b"
)
#: the password of a URL's ``user:password@`` part (group 1 keeps the scheme and user)
URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@")
MASK = "***"
MIN_SECRET_LEN = 8  # shorter values are not credentials and would mask ordinary words


def is_secret_name(name: str) -> bool:
    """Whether the environment variable (or key) ``name`` holds a secret: a secret word in it,
    and it does not name a location (``…_PATH``)."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    return bool(words) and words[-1] not in LOCATION_WORDS and any(w in SECRET_WORDS for w in words)


def is_secret_key(name: str) -> bool:
    """Config keys whose (string) values are secrets."""
    return bool(SECRET_KEY.search(name))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret variables, longest first (so a secret inside another masks last)."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def secret_config_values(obj: Any) -> list[str]:
    """String values under secret config keys anywhere in ``obj`` (for masking error text about it)."""
    found: list[str] = []
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(key, str) and is_secret_key(key) and isinstance(value, str) and value:
                found.append(value)
            else:
                found.extend(secret_config_values(value))
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            found.extend(secret_config_values(value))
    return found


def redact_text(text: str, environ: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> str:
    """``text`` with secret values (and the ``extra`` strings) masked, for display."""
    values = set(secret_values(environ)) | {v for v in extra if len(v) >= MIN_SECRET_LEN}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, MASK)
    return URL_PASSWORD.sub(rf"\g<1>{MASK}@", TOKEN_SHAPES.sub(MASK, text))


def redact(obj: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of a config-like structure with secret keys and secret values masked, for display."""
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
