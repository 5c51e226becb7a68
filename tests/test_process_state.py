"""Every process-wide mutable object of both packages is documented in one place:
docs/architecture.md, "Trainer–rollout link and process-wide state".

Found on the AST (nothing is imported): a module-level name bound to an empty mutable container
(``{}``, ``[]``, ``dict()``, ``set()``, ``OrderedDict()``, ``WeakKeyDictionary()``, ``threading.local()`` …) or to an
instance of a class of the same module whose ``__init__`` sets attributes on ``self``, and a
module-level function memoised by ``functools.cache`` / ``lru_cache`` (its cache lives as long as
the process).
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_architecture import REPO, ROOTS, module_files

SECTION = "## Trainer–rollout link and process-wide state"
CONTAINERS = {"dict", "list", "set", "OrderedDict", "defaultdict", "deque", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet",
              "local"}  # threading.local(): a store of its own in every thread
MEMOISERS = {"cache", "lru_cache"}


def _callee(node: ast.Call) -> str | None:
    return _name(node.func)


def _name(node: ast.expr) -> str | None:
    """``x`` of ``x`` or ``module.x``."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _memoised(function: ast.FunctionDef) -> bool:
    """Whether ``@cache``, ``@lru_cache``, ``@lru_cache(...)`` (or the ``functools.`` forms) decorate it."""
    return any(_name(d.func if isinstance(d, ast.Call) else d) in MEMOISERS for d in function.decorator_list)


def _stateful_classes(tree: ast.Module) -> set[str]:
    """Classes of the module whose ``__init__`` assigns ``self.<attribute>``."""
    found = set()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for init in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
            targets = [t for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
            if any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" for t in targets):
                found.add(cls.name)
    return found


def process_wide_objects(path: Path) -> list[str]:
    """Names of the module-level mutable stores and stateful singletons of one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    stateful = _stateful_classes(tree)
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _memoised(node):
            names.append(node.name)
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        empty_literal = (isinstance(value, ast.Dict) and not value.keys) or (isinstance(value, ast.List) and not value.elts)
        call = _callee(value) if isinstance(value, ast.Call) else None
        empty_container = call in CONTAINERS and (call == "defaultdict" or not value.args)
        if empty_literal or empty_container or call in stateful:
            names.append(target.id)
    return names


def documented_section() -> str:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:] if end < 0 else text[start:end]


def test_every_process_wide_object_is_documented():
    section = documented_section()
    missing = [
        f"{path.relative_to(REPO)}: {name}"
        for path in module_files(ROOTS).values()
        for name in process_wide_objects(path)
        if f"`{name}`" not in section and f"`{name}()`" not in section
    ]
    assert not missing, (
        f"process-wide objects missing from docs/architecture.md, '{SECTION[3:]}' (say who writes and reads "
        "each, its lifetime and why it is process-wide, or give it an owner instead):\n" + "\n".join(missing)
    )


def test_the_scan_finds_the_known_objects():
    """The check above sees the objects it exists for (an empty scan would pass it)."""
    found = {name for path in module_files(ROOTS).values() for name in process_wide_objects(path)}
    assert {"STEP_CLOCK", "LEDGER", "_scorer_sets", "_schedulers", "_LINKS", "installed_plugins"} <= found


def test_the_scan_tells_stores_from_constants(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import weakref\nfrom collections import OrderedDict\n"
        "class Clock:\n    def __init__(self):\n        self.spans = []\n"
        "class Stateless:\n    mode = 'x'\n"
        "TABLE = {'a': 1}\nNAMES = ['a']\nCLOCK = Clock()\nCHECKER = Stateless()\n"
        "_cache: dict[str, int] = {}\n_pool = OrderedDict()\n_refs = weakref.WeakKeyDictionary()\nSEEN = set()\n"
        "import functools\n@functools.lru_cache(maxsize=1)\ndef plugins():\n    return 1\n"
        "@functools.cache\ndef bins(n):\n    return n\n@staticmethod\ndef plain():\n    return 0\n",
        encoding="utf-8",
    )
    assert process_wide_objects(module) == ["CLOCK", "_cache", "_pool", "_refs", "SEEN", "plugins", "bins"]
