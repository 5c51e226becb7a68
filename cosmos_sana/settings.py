"""Read cosmos-sana's settings out of a cosmos-rl ``Config`` (or a raw TOML dict)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from cosmos_sana.config import SanaCustomConfig


class SettingsError(ValueError):
    """``[custom]`` does not validate; the message names every bad key path."""


def format_validation_error(exc: ValidationError, prefix: str) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        lines.append(f"  {path}: {err['msg']}")
    return "\n".join(lines)


def parse_custom(custom: dict[str, Any], source: str = "<config>") -> SanaCustomConfig:
    try:
        return SanaCustomConfig.model_validate(custom)
    except ValidationError as exc:
        raise SettingsError(f"{source}: invalid [custom] table\n{format_validation_error(exc, 'custom')}") from exc


def settings_of(cosmos_config: Any) -> SanaCustomConfig:
    """Our settings from a cosmos-rl ``Config`` (workers receive it over HTTP)."""
    custom = cosmos_config.custom if hasattr(cosmos_config, "custom") else cosmos_config["custom"]
    return parse_custom(dict(custom))
