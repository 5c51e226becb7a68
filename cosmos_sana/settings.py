"""Read cosmos-sana's settings out of a cosmos-rl ``Config`` (or a raw TOML dict), and validate
a component's ``args`` against the params model its plugin registered."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
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


def same_table(a: Any, b: Any) -> bool:
    """``a == b`` with the type of every value equal too (``{"x": 1} != {"x": True}``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_table(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_table(x, y) for x, y in zip(a, b))
    return bool(a == b)


class _ParsedCustom:
    """The last few ``[custom]`` tables parsed, by the id of the config they came from.

    The rollout, the trainers and the reward function ask for the settings of the same config
    on every call; validating ``[custom]`` once per config is enough. The parse reads ``[custom]``
    alone, so a hit needs only the table to be the one parsed (a deep copy is kept): a config whose
    ``custom`` changed, or a new object that reuses a freed one's id, is parsed again. Values are
    compared with their types (``1``, ``1.0`` and ``True`` are equal in Python but a component's
    ``args`` keeps whichever it was given).
    """

    SIZE = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[dict[str, Any], SanaCustomConfig]] = OrderedDict()

    def get(self, key: int, custom: dict[str, Any]) -> SanaCustomConfig:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and same_table(entry[0], custom):
                self._entries.move_to_end(key)
                return entry[1]
        settings = parse_custom(custom)
        with self._lock:
            self._entries[key] = (copy.deepcopy(custom), settings)
            self._entries.move_to_end(key)
            while len(self._entries) > self.SIZE:
                self._entries.popitem(last=False)
        return settings


_PARSED = _ParsedCustom()


def settings_of(cosmos_config: Any) -> SanaCustomConfig:
    """Our settings from a cosmos-rl ``Config`` or a raw TOML dict (workers receive the config over HTTP).

    ``[custom]`` is validated once per config (and again only if it changed); every caller gets
    the same :class:`SanaCustomConfig` object, which nobody may modify.
    """
    custom = cosmos_config.custom if hasattr(cosmos_config, "custom") else cosmos_config["custom"]
    return _PARSED.get(id(cosmos_config), dict(custom))


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
