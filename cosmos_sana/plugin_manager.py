"""Discover plugins through the ``cosmos_sana.plugins`` entry-point group.

Built-ins and third-party packages take the same route. The result is a
:class:`PluginRegistry`: per kind, name → :class:`~cosmos_sana.specs.Registered`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import pluggy

from cosmos_sana import hookspecs
from cosmos_sana.specs import SPEC_KINDS, Registered


class PluginError(RuntimeError):
    """A plugin could not be loaded, or two plugins clash."""


class DuplicateComponentError(PluginError):
    def __init__(self, kind: str, name: str, first: Registered, second: Registered):
        super().__init__(
            f"{kind} {name!r} is registered twice: by plugin {first.plugin!r} "
            f"(distribution {first.distribution}) and by plugin {second.plugin!r} "
            f"(distribution {second.distribution}); uninstall one or rename the component"
        )
        self.kind, self.name, self.first, self.second = kind, name, first, second


class UnknownComponentError(PluginError, KeyError):
    def __init__(self, kind: str, name: str, known: Iterable[str]):
        import difflib

        known = sorted(known)
        hint = difflib.get_close_matches(name, known, n=1)
        msg = f"unknown {kind} {name!r}"
        if hint:
            msg += f" (did you mean {hint[0]!r}?)"
        msg += f"; registered: {', '.join(known) or 'none'}"
        super().__init__(msg)
        self.kind, self.name = kind, name

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class PluginRegistry:
    """Everything the loaded plugins registered, by kind and name."""

    def __init__(self) -> None:
        self._by_kind: dict[str, dict[str, Registered]] = {kind: {} for kind in SPEC_KINDS}

    def add(self, registered: Registered) -> None:
        spec = registered.spec
        table = self._by_kind[spec.kind]
        if spec.name in table:
            raise DuplicateComponentError(spec.kind, spec.name, table[spec.name], registered)
        table[spec.name] = registered

    def get(self, kind: str, name: str) -> Any:
        """The spec registered under ``name``; a helpful error when there is none."""
        table = self._by_kind[kind]
        if name not in table:
            raise UnknownComponentError(kind, name, table)
        return table[name].spec

    def names(self, kind: str) -> list[str]:
        return sorted(self._by_kind[kind])

    def entries(self, kind: str) -> list[Registered]:
        return [self._by_kind[kind][n] for n in self.names(kind)]

    def kinds(self) -> list[str]:
        return list(self._by_kind)


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def collect(pm: pluggy.PluginManager) -> PluginRegistry:
    """Call every hook implementation once and file its specs by origin."""
    dists = {
        id(plugin): f"{dist.metadata['name']} {dist.version}"
        for plugin, dist in pm.list_plugin_distinfo()
    }
    registry = PluginRegistry()
    for kind, hook_name in SPEC_KINDS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            specs = impl.function() or []
            for spec in specs:
                if spec.kind != kind:
                    raise PluginError(
                        f"plugin {impl.plugin_name!r} returned a {spec.kind} spec "
                        f"{spec.name!r} from hook {hook_name}"
                    )
                registry.add(
                    Registered(
                        spec=spec,
                        plugin=impl.plugin_name,
                        distribution=dists.get(id(impl.plugin), "<not from a distribution>"),
                    )
                )
    return registry


def load_plugins(extra: Iterable[Any] = ()) -> PluginRegistry:
    """Load every installed plugin (plus ``extra`` plugin objects) and collect."""
    pm = new_plugin_manager()
    try:
        pm.load_setuptools_entrypoints(hookspecs.ENTRY_POINT_GROUP)
    except Exception as exc:  # an entry point that fails to import
        raise PluginError(f"loading {hookspecs.ENTRY_POINT_GROUP} entry points failed: {exc}") from exc
    for plugin in extra:
        pm.register(plugin)
    return collect(pm)


@functools.lru_cache(maxsize=1)
def installed_plugins() -> PluginRegistry:
    """The process-wide registry of installed plugins (loaded once)."""
    return load_plugins()
