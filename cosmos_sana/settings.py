"""Read cosmos-sana's settings out of a cosmos-rl ``Config`` (or a raw TOML dict), and validate
a component's ``args`` against the params model its plugin registered."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from cosmos_sana.config import ComponentRef, SanaCustomConfig
from cosmos_sana.plugin_manager import PluginRegistry


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


def component_params(registry: PluginRegistry, kind: str, ref: ComponentRef, where: str) -> Any:
    """Validate ``ref.args`` against the component's params model (strict)."""
    spec = registry.get(kind, ref.name)
    model = spec.params_model()
    if model is None:
        if ref.args:
            raise SettingsError(f"{where}.args: {kind} {ref.name!r} takes no args, got {sorted(ref.args)}")
        return None
    try:
        return model.model_validate(ref.args)
    except ValidationError as exc:
        raise SettingsError(
            f"{where}.args: invalid args for {kind} {ref.name!r}\n{format_validation_error(exc, where + '.args')}"
        ) from exc
