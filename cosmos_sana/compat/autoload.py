"""Load cosmos-sana into cosmos-rl's processes for the bare ``cosmos-rl --config X.toml``.

cosmos-rl without a script argument runs its stock modules (controller, policy,
rollout) via ``python -m``; nothing there discovers plugins. The installed
``cosmos_sana_autoload.pth`` calls :func:`activate` at interpreter start, but
only when the command line mentions cosmos (a string test, nothing imported).

* In the launcher process (``cosmos-rl`` / ``python -m cosmos_rl.launcher.launch_all``)
  it reads ``--config``; when the TOML says ``[custom] package = "cosmos-sana"`` it
  sets ``COSMOS_SANA_AUTOLOAD=1``, which every child process inherits.
* In a child with ``COSMOS_ROLE`` and ``COSMOS_SANA_AUTOLOAD=1`` started as
  ``python -m <stock entry module>``, it redirects that one ``-m`` lookup to
  :mod:`cosmos_sana.bridge`, which loads the plugins and calls cosmos-rl's worker
  entry with our datasets, packers and rewards.
* On by default (``COSMOS_SANA_FAST_STARTUP=0`` restores cosmos-rl's own start-up and shutdown):
  in the launcher and in the torchrun wrapper of each replica, processes that only start
  other processes, cosmos-rl's package bodies (``cosmos_rl/__init__.py`` imports every
  subpackage, model auto-discovery included) run only once something asks for a name they
  define (:func:`defer_cosmos_rl_package_bodies`); a full import of cosmos-rl there cost as
  much as in the roles that train. The launcher also starts the replicas without waiting for the
  controller to answer first (:func:`cosmos_sana.compat.cosmos_rl.patch_launcher_controller_wait`).
* The Sol-RL how-to's forms ``cosmos-rl --config X.toml cosmos_rl.tools.dataset.diffusion_nft``
  (NFT) and ``... cosmos_rl.tools.dataset.diffusers_dataset`` (SFT) are redirected the same
  way in every role, so upstream's dataset script (its own prompt sets and packer) never runs
  with our recipes. Any other script of ``cosmos_rl.tools.dataset`` with our recipe is refused
  in the launcher, before anything starts, with the forms that work.

Standard library only at import: this runs before anything else in those processes. Only a
launcher given ``--config`` goes further, reading the recipe with cosmos-sana's one TOML reader
(:func:`cosmos_sana.config.recipe_file.read_toml`, which loads the config package and pydantic).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from typing import NoReturn

#: when this interpreter reached its site start-up hook (``time.monotonic``): the bridge logs
#: how long its role took to import from here
INTERPRETER_STARTED = time.monotonic()

ENV_FLAG = "COSMOS_SANA_AUTOLOAD"
DISABLE_FLAG = "COSMOS_SANA_NO_AUTOLOAD"
#: cosmos-sana's start-up and shutdown patches (deferred package bodies in the launch-only processes,
#: replicas started beside the controller, the shutdown sleep as a poll) run unless this is ``0``,
#: which keeps cosmos-rl's own start-up and shutdown. Unset, empty (a shell's way of clearing it) or
#: ``1`` means on; any other value is refused rather than read as either.
FAST_STARTUP_FLAG = "COSMOS_SANA_FAST_STARTUP"
FAST_STARTUP_VALUES = {"0": False, "1": True, "": True}

#: Modules cosmos-rl's launch scripts run with ``python -m`` when no script is given.
STOCK_ENTRY_MODULES = frozenset(
    {
        "cosmos_rl.dispatcher.run_web_panel",  # Controller
        "cosmos_rl.policy.train",  # Policy
        "cosmos_rl.rollout.rollout_entry",  # Rollout
        "cosmos_rl.reference.reference_entry",  # Reference
    }
)
#: Upstream dataset scripts the Sol-RL how-to passes as the script argument; ours run instead.
HOWTO_SCRIPT_MODULES = frozenset(
    {
        "cosmos_rl.tools.dataset.diffusion_nft",  # NFT and video NFT
        "cosmos_rl.tools.dataset.diffusers_dataset",  # SFT and SFT LoRA
    }
)
UPSTREAM_DATASET_SCRIPTS = "cosmos_rl.tools.dataset"
WORKING_FORMS = (
    "cosmos-rl --config X.toml",
    "cosmos-rl --config X.toml cosmos_sana.bridge",
    *(f"cosmos-rl --config X.toml {module}" for module in sorted(HOWTO_SCRIPT_MODULES)),
)
LAUNCHER_MODULE = "cosmos_rl.launcher.launch_all"
LAUNCHER_SCRIPT = "cosmos-rl"
#: what cosmos-rl's replica script runs as ``python -m`` to start torchrun
TORCHRUN_WRAPPER_MODULE = "cosmos_rl.launcher.torchrun"
#: packages whose ``__init__`` bodies the launch-only processes defer
DEFERRED_PACKAGES = ("cosmos_rl", "cosmos_rl.launcher", "cosmos_rl.dispatcher.data")
BRIDGE_CODE = "from cosmos_sana.bridge import main\nmain()\n"


#: interpreter options whose value is the next argument (``python -X importtime -m ...``)
_OPTIONS_WITH_VALUE = frozenset({"-X", "-W"})


def _argv_module(argv: list[str]) -> str | None:
    """The module name after ``-m`` in an interpreter command line, if any."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None)
        if arg in _OPTIONS_WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-"):
            return None
    return None


def _config_path(argv: list[str]) -> str | None:
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def config_wants_cosmos_sana(path: str) -> bool:
    """Whether a TOML file says ``[custom] package = "cosmos-sana"`` (the launcher only)."""
    from cosmos_sana.config.recipe_file import read_toml

    try:
        data = read_toml(path)
    except ValueError:
        return False  # cosmos-rl reports unreadable configs itself
    custom = data.get("custom")
    return isinstance(custom, dict) and custom.get("package") == "cosmos-sana"


def unsupported_script(argv: list[str]) -> str | None:
    """The launcher's script argument when it is one of upstream's dataset scripts that would
    run instead of ours: any module of ``cosmos_rl.tools.dataset`` but :data:`HOWTO_SCRIPT_MODULES`,
    or any of their files (a file runs as given, so it cannot be redirected)."""
    folder = "/" + UPSTREAM_DATASET_SCRIPTS.replace(".", "/") + "/"
    for arg in argv[1:]:
        if arg.startswith(f"{UPSTREAM_DATASET_SCRIPTS}.") and arg not in HOWTO_SCRIPT_MODULES:
            return arg
        if arg.endswith(".py") and folder in "/" + arg.replace(os.sep, "/"):
            return arg
    return None


def refusal_message(script: str, config: str) -> str:
    forms = "\n".join(f"  {form}" for form in WORKING_FORMS)
    return (
        f"cosmos-sana: {config} is a cosmos-sana recipe; the script {script} would replace its datasets, "
        f"rollout and rewards with upstream's. Run it in one of these forms (X.toml = {config}):\n{forms}\n"
    )


def _refuse(message: str) -> NoReturn:
    """Stop the launcher before it starts anything (this runs at interpreter start-up, where an
    exception would end as a fatal site-module error instead of a message)."""
    sys.stderr.write(message)
    sys.stderr.flush()
    os._exit(2)


def is_launcher(argv: list[str]) -> bool:
    if len(argv) > 1 and os.path.basename(argv[1]) == LAUNCHER_SCRIPT:
        return True
    return _argv_module(argv) == LAUNCHER_MODULE


class _BridgeLoader(importlib.abc.Loader):
    """Serves the bridge stub as the code of the stock entry module runpy asked for."""

    def __init__(self, module_name: str) -> None:
        self.module_name = module_name

    def create_module(self, spec):  # default module creation
        return None

    def get_code(self, fullname: str):
        return compile(BRIDGE_CODE, f"<cosmos-sana bridge for {self.module_name}>", "exec")

    def is_package(self, fullname: str) -> bool:
        return False

    def exec_module(self, module) -> None:
        exec(self.get_code(module.__name__), module.__dict__)


class EntryRedirectFinder(importlib.abc.MetaPathFinder):
    """Redirects the first ``python -m <stock entry>`` lookup to the bridge."""

    def __init__(self, target_module: str) -> None:
        self.target_module = target_module
        self.redirected = False

    def find_spec(self, fullname, path=None, target=None):
        if self.redirected or fullname != self.target_module:
            return None
        # runpy looks the module up while sys.argv[0] is still the literal "-m"
        if not sys.argv or sys.argv[0] != "-m":
            return None
        self.redirected = True
        sys.meta_path.remove(self)
        return importlib.util.spec_from_loader(fullname, _BridgeLoader(fullname), origin="cosmos-sana")


class _DeferredBodyLoader(importlib.abc.Loader):
    """Creates a package with its ``__path__`` but runs its ``__init__`` body only when a name the
    package does not have yet is asked for (``cosmos_rl.policy`` as an attribute, ``from cosmos_rl
    import x``). Importing a submodule by its full name never needs the body."""

    def __init__(self, body_loader: importlib.abc.Loader) -> None:
        self.body_loader = body_loader

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        body_loader = self.body_loader

        def run_body_then_get(name: str):
            del module.__getattr__
            body_loader.exec_module(module)
            try:
                return module.__dict__[name]
            except KeyError:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None

        module.__getattr__ = run_body_then_get


class DeferredPackageFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`DEFERRED_PACKAGES` as usual and hands them to :class:`_DeferredBodyLoader`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in DEFERRED_PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return None
        spec.loader = _DeferredBodyLoader(spec.loader)
        return spec


def defer_cosmos_rl_package_bodies() -> None:
    """Upstream's ``cosmos_rl/__init__.py`` imports every subpackage (policy with its model
    auto-discovery, rollout, colocated, tools, simulators...) and ``cosmos_rl/launcher/__init__.py``
    imports the worker entry (torch, transformers, datasets), so each process that names any
    ``cosmos_rl`` module pays for all of it. The launcher and the torchrun wrapper only start other
    processes: with the bodies deferred they import just the modules they name (the wrapper: one
    constant module, then torch's own torchrun). Any name the bodies define still resolves, by
    running the body then."""
    if not any(isinstance(finder, DeferredPackageFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, DeferredPackageFinder())


#: upstream module → (our module, function) called with it right after it is imported, in the launcher
LAUNCHER_POST_IMPORT_PATCHES = {
    "cosmos_rl.launcher.launch_all": ("cosmos_sana.compat.cosmos_rl", "patch_launcher_controller_wait"),
}


class _PatchAfterLoader(importlib.abc.Loader):
    """Runs the module as usual, then hands it to the patch named in :data:`LAUNCHER_POST_IMPORT_PATCHES`.
    Anything else (``get_code`` for ``python -m``, which then runs unpatched) goes to the real loader."""

    def __init__(self, real_loader: importlib.abc.Loader, patch: tuple[str, str]) -> None:
        self.real_loader = real_loader
        self.patch = patch

    def __getattr__(self, name: str):
        return getattr(self.real_loader, name)

    def create_module(self, spec):
        return self.real_loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.real_loader.exec_module(module)
        module_name, function = self.patch
        getattr(importlib.import_module(module_name), function)(module)


class PostImportPatchFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        patch = LAUNCHER_POST_IMPORT_PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchAfterLoader(spec.loader, patch)
        return spec


def fast_startup(environ: dict | None = None) -> bool:
    """Whether cosmos-sana's start-up patches run (``os.environ`` by default): yes unless
    :data:`FAST_STARTUP_FLAG` is ``0``; ValueError naming the variable for a value other than 0 or 1."""
    value = (os.environ if environ is None else environ).get(FAST_STARTUP_FLAG, "")
    if value not in FAST_STARTUP_VALUES:
        raise ValueError(
            f"{FAST_STARTUP_FLAG}={value!r}: use 0 (cosmos-rl's own start-up and shutdown) or 1 "
            f"(cosmos-sana's start-up patches, also what unset means)"
        )
    return FAST_STARTUP_VALUES[value]


def _fast_startup_or_refuse(environ: dict) -> bool:
    """:func:`fast_startup` for the launch-only processes, whose bad flag stops them with the message."""
    try:
        return fast_startup(environ)
    except ValueError as error:
        _refuse(f"cosmos-sana: {error}\n")


def activate(argv: list[str] | None = None, environ: dict | None = None) -> str:
    """Install the right hook for this process; returns what it did (for tests)."""
    argv = list(sys.orig_argv if argv is None else argv)
    environ = os.environ if environ is None else environ
    if environ.get(DISABLE_FLAG):
        return "disabled"
    if "COSMOS_ROLE" not in environ and is_launcher(argv):
        config = _config_path(argv)
        if config and config_wants_cosmos_sana(config):
            script = unsupported_script(argv)
            if script is not None:
                _refuse(refusal_message(script, config))
            fast = _fast_startup_or_refuse(environ)
            environ[ENV_FLAG] = "1"
            if fast:
                defer_cosmos_rl_package_bodies()
                sys.meta_path.insert(0, PostImportPatchFinder())
            return "launcher-flagged"
        return "launcher-not-ours"
    if environ.get("COSMOS_ROLE") and environ.get(ENV_FLAG) == "1":
        module = _argv_module(argv)
        if module == TORCHRUN_WRAPPER_MODULE:
            if not _fast_startup_or_refuse(environ):
                return "inactive"
            defer_cosmos_rl_package_bodies()
            return "deferred-package-bodies"
        if module in STOCK_ENTRY_MODULES or module in HOWTO_SCRIPT_MODULES:
            sys.meta_path.insert(0, EntryRedirectFinder(module))
            return "redirect-installed"
    return "inactive"
