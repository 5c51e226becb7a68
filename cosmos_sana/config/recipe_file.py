"""Reading a recipe TOML file: the one reader every command, role and check uses.

:func:`read_toml` turns a missing file, a folder, an unreadable or binary file and bad TOML
into a :class:`ConfigInvalid` naming the file (``<file>: no such file``, ``<toml>: not valid
TOML: ...``).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Issue:
    """One problem of a recipe, at a key path (or ``<file>`` / ``<toml>``)."""

    path: str
    message: str

    def render(self, source: str) -> str:
        return f"{source}: {self.path}: {self.message}"


class ConfigInvalid(ValueError):
    """A recipe's problems, all of them, each with its key path; ``source`` names the file."""

    def __init__(self, source: str, issues: list[Issue]):
        self.source, self.issues = source, issues
        super().__init__("\n".join(issue.render(source) for issue in issues))


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document at ``path``; an unreadable, binary or malformed file raises
    :class:`ConfigInvalid` naming the file."""
    path = Path(path)

    def invalid(where: str, message: str) -> ConfigInvalid:
        return ConfigInvalid(str(path), [Issue(where, message)])

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise invalid("<file>", "no such file") from None
    except IsADirectoryError:
        raise invalid("<file>", "is a folder; give the recipe's .toml file") from None
    except OSError as exc:
        raise invalid("<file>", f"cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("<file>", f"not a text file (byte {exc.start} is not UTF-8); a recipe is a TOML text file") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise invalid("<toml>", f"not valid TOML: {exc}") from None
