"""Import rules of the source tree, checked on the AST of every module (nothing is imported).

1. Dependencies run one way: ``cosmos_sana_plugins`` may import ``cosmos_sana``, never the reverse.
   The core reaches model- or dataset-specific code only through the specs plugins register.
2. No import cycle between modules of either package.

Every ``import`` / ``from ... import`` counts, at module level or inside a function, and so does a
string passed to ``importlib.import_module`` or ``__import__``. For cycles, imports under
``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = "cosmos_sana"
PLUGINS = "cosmos_sana_plugins"
ROOTS = {CORE: REPO / CORE, PLUGINS: REPO / "plugins" / PLUGINS}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (absolute, before resolving ``from pkg import name``)
    names: tuple[str, ...]  # ``from target import names``; empty for ``import target``
    where: str  # file:line
    type_checking: bool


def module_files(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under each package root."""
    modules: dict[str, Path] = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _string_import(node: ast.Call) -> str | None:
    """The module of ``importlib.import_module("x")`` / ``import_module("x")`` / ``__import__("x")``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def imports_of(module: str, path: Path, base: Path) -> list[Import]:
    """Every import in ``path``; ``base`` is the folder file names are given relative to."""
    shown = path.relative_to(base).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(module, alias.name, (), f"{shown}:{node.lineno}", type_checking))
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            found.append(Import(module, _absolute(module, is_package, node), names, f"{shown}:{node.lineno}", type_checking))
        elif isinstance(node, ast.Call) and (target := _string_import(node)) is not None:
            found.append(Import(module, target, (), f"{shown}:{node.lineno}", type_checking))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(tree, False)
    return found


def all_imports(roots: dict[str, Path], base: Path = REPO) -> tuple[dict[str, Path], list[Import]]:
    modules = module_files(roots)
    return modules, [imp for module, path in modules.items() for imp in imports_of(module, path, base)]


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def reverse_imports(imports: list[Import], core: str = CORE, plugins: str = PLUGINS) -> list[str]:
    """``file:line: a imports b`` for every import of the plugins package by a core module."""
    return [
        f"{imp.where}: {imp.source} imports {imp.target}"
        for imp in imports
        if _in_package(imp.source, core) and _in_package(imp.target, plugins)
    ]


def import_graph(modules: dict[str, Path], imports: list[Import]) -> dict[str, dict[str, Import]]:
    """Module → {imported module of this tree → the import}, ``TYPE_CHECKING`` imports left out.

    ``from pkg import name`` imports the module ``pkg.name`` when there is one, else ``pkg``."""
    graph: dict[str, dict[str, Import]] = {module: {} for module in modules}
    for imp in imports:
        if imp.type_checking:
            continue
        targets = [f"{imp.target}.{n}" if f"{imp.target}.{n}" in modules else imp.target for n in imp.names]
        for target in targets or [imp.target]:
            if target in modules and target != imp.source:
                graph[imp.source].setdefault(target, imp)
    return graph


def cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through each strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(node: str) -> None:  # Tarjan; the tree is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                strongconnect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return [_cycle_in(graph, set(component), component[0]) for component in components]


def _cycle_in(graph: dict[str, dict[str, Import]], members: set[str], start: str) -> list[str]:
    """A shortest path start → ... → start inside one strongly connected component (breadth first)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ not in members:
                    continue
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if succ not in parents:
                    parents[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def describe_cycle(graph: dict[str, dict[str, Import]], cycle: list[str]) -> str:
    steps = [f"{a} → {b} ({graph[a][b].where})" for a, b in zip(cycle, cycle[1:])]
    return "import cycle: " + "; ".join(steps)


def test_core_never_imports_the_builtin_plugins():
    _, imports = all_imports(ROOTS)
    offenders = reverse_imports(imports)
    assert not offenders, (
        "cosmos_sana must reach plugin code through the specs plugins register, not by importing it:\n"
        + "\n".join(offenders)
    )


def test_no_import_cycles():
    modules, imports = all_imports(ROOTS)
    graph = import_graph(modules, imports)
    found = [describe_cycle(graph, cycle) for cycle in cycles(graph)]
    assert not found, "\n".join(found)


def test_tools_stand_alone():
    """``cosmos_sana/tools`` (wheelhouse builder, tiny pipelines) uses no other part of the core:
    docs/architecture.md promises it, so packaging and test tools never drag training code in."""
    tools = f"{CORE}.tools"
    _, imports = all_imports(ROOTS)
    offenders = [
        f"{imp.where}: {imp.source} imports {imp.target}"
        for imp in imports
        if _in_package(imp.source, tools) and _in_package(imp.target, CORE) and not _in_package(imp.target, tools)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_rollout_plugin_depends_on_the_trainers_plugin_never_the_reverse():
    """docs/architecture.md puts the trainer–rollout link in the trainers package for this reason."""
    trainers, rollout = f"{PLUGINS}.trainers", f"{PLUGINS}.rollout"
    _, imports = all_imports(ROOTS)
    offenders = [f"{imp.where}: {imp.source} imports {imp.target}" for imp in imports
                 if _in_package(imp.source, trainers) and _in_package(imp.target, rollout)]
    assert not offenders, "\n".join(offenders)
    assert any(_in_package(imp.source, rollout) and imp.target == f"{trainers}.rollout_link" for imp in imports)


def test_every_module_is_parsed():
    """The walk sees both packages in full (an empty walk would pass the checks above)."""
    modules, imports = all_imports(ROOTS)
    assert f"{CORE}.plugin_manager" in modules and f"{PLUGINS}.sana.model" in modules
    assert len(modules) == sum(1 for root in ROOTS.values() for _ in root.rglob("*.py"))
    plugin_to_core = [imp for imp in imports if _in_package(imp.source, PLUGINS) and _in_package(imp.target, CORE)]
    assert plugin_to_core  # the allowed direction is present, so imports are being read


# --- the checks themselves, on a small made-up tree -------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.fixture
def toy_tree(tmp_path):
    core, plugins = tmp_path / "core", tmp_path / "plugs"
    _write(core, {
        "__init__.py": "",
        "a.py": "def f():\n    from core.sub import b\n",                     # a → core.sub.b (module)
        "sub/__init__.py": "",
        "sub/b.py": "from ..c import helper\n",                              # relative: b → core.c
        "c.py": "import importlib\n\ndef g():\n    return importlib.import_module('core.a')\n",  # c → a
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import core.e\n",
        "e.py": "import core.d\n",                                           # d ↔ e only under TYPE_CHECKING
        "f.py": "def load():\n    from plugs.x import thing\n",              # core → plugins inside a function
        "g.py": "import importlib\nimportlib.import_module('plugs.x')\n",    # core → plugins by string
    })
    _write(plugins, {"__init__.py": "", "x.py": "from core import a\nthing = 1\n"})
    return {"core": core, "plugs": plugins}, tmp_path


def test_checks_find_reverse_imports_at_any_level(toy_tree):
    _, imports = all_imports(*toy_tree)
    found = reverse_imports(imports, core="core", plugins="plugs")
    assert found == ["core/f.py:2: core.f imports plugs.x", "core/g.py:2: core.g imports plugs.x"]


def test_checks_find_a_cycle_through_function_relative_and_string_imports(toy_tree):
    modules, imports = all_imports(*toy_tree)
    graph = import_graph(modules, imports)
    assert graph["core.sub.b"].keys() == {"core.c"}  # ``from ..c import helper``: helper is no module
    assert graph["plugs.x"].keys() == {"core.a"}  # ``from core import a``: a is a module
    found = cycles(graph)
    assert found == [["core.a", "core.sub.b", "core.c", "core.a"]]  # d ↔ e (TYPE_CHECKING) is no cycle
    assert describe_cycle(graph, found[0]) == (
        "import cycle: core.a → core.sub.b (core/a.py:2); core.sub.b → core.c (core/sub/b.py:1); "
        "core.c → core.a (core/c.py:4)"
    )
