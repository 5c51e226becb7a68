"""The ``cosmos_sana`` logger namespace, with secret redaction on every record, and the
filter that keeps other packages' known-harmless start-up messages out of our commands."""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import logging
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from cosmos_sana.redaction import redact_text

T = TypeVar("T")

ROOT = "cosmos_sana"


class RedactingFilter(logging.Filter):
    """Masks secret environment values in the fully formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


class RedactingFormatter(logging.Formatter):
    """Also masks secrets that only appear in exception text."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class ProgressAwareHandler(logging.StreamHandler):
    """Writes to ``stream`` or, by default, the current ``sys.stderr``, above an open tqdm progress
    bar (through ``tqdm.write``) instead of onto its line.

    Without a stream, ``sys.stderr`` is looked up at every record, not kept from when the handler was
    made: a process that replaces ``sys.stderr`` later (the commands' redacting wrapper, a test's
    capture) would otherwise get our messages on the old stream, or a logging error once it is closed.
    """

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._stream = stream

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr if self._stream is None else self._stream

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ and setStream assign it
        self._stream = value

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
        if tqdm is None or not getattr(tqdm, "_instances", None):
            super().emit(record)
            return
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


class RedactingStream:
    """A text stream that masks secrets in every write and passes everything else (``isatty``,
    ``fileno``, ``flush``…) to the stream it wraps: the commands' ``error: …`` lines print
    exception text that may quote a secret (a URL with its password, a token given as a value)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact_text(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.contextmanager
def redacted_stderr() -> Iterator[None]:
    """``sys.stderr`` masks secrets inside (see :class:`RedactingStream`)."""
    original = sys.stderr
    sys.stderr = RedactingStream(original)
    try:
        yield
    finally:
        sys.stderr = original


def get_logger(name: str = "") -> logging.Logger:
    """``cosmos_sana`` or a child of it (``get_logger(__name__)`` works too)."""
    if not name or name == ROOT:
        return _root()
    if not name.startswith(f"{ROOT}."):  # "cosmos_sana_plugins..." is not a child of "cosmos_sana"
        name = f"{ROOT}.{name}"
    _root()
    return logging.getLogger(name)


def _root() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if not getattr(logger, "_cosmos_sana_configured", False):
        handler = ProgressAwareHandler()
        handler.setFormatter(RedactingFormatter("[cosmos-sana %(levelname)s %(name)s] %(message)s"))
        handler.addFilter(RedactingFilter())
        logger.addHandler(handler)
        logger.addFilter(RedactingFilter())
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger._cosmos_sana_configured = True  # type: ignore[attr-defined]
    return logger


#: seconds a loop runs before :func:`progress` shows its bar
PROGRESS_DELAY_S = 2.0


def progress(items: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
    """``items`` with a progress bar on stderr for a long loop of ours: shown only in a terminal, and only
    once the loop has run for :data:`PROGRESS_DELAY_S` (short loops and captured output stay clean)."""
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, unit=unit, delay=PROGRESS_DELAY_S, disable=None, leave=False,
                file=sys.stderr)


def add_file_handler(path: str) -> logging.Handler:
    """Mirror the namespace to a file (the run's output folder), redacted too."""
    handler = logging.FileHandler(path)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    _root().addHandler(handler)
    return handler


# ---------------------------------------------------------------- third-party noise
#: Log records of other packages that cosmos-sana's commands hide unless run with ``-v``:
#: (logger the record is created on, regular expression its message matches). Each is
#: harmless for cosmos-sana: a backend or feature it does not use, or a default it sets itself.
HARMLESS_RECORDS: tuple[tuple[str, str], ...] = (
    ("cosmos", r"^Failed to import VLLM Rollout"),  # the SANA rollout is ours, not vLLM
    ("cosmos", r"^transformer_engine\.pytorch is not available"),  # only cosmos-rl's DeepSeek needs it
    ("cosmos", r"^top_k is not set for distillation"),  # distillation is off in every recipe
    ("cosmos", r"^Distillation is not enabled"),
    ("cosmos", r"^imageio is not installed"),  # cosmos-rl's own video logging; ours writes media itself
    # cosmos-rl's remote rewards on Wan latents; ours send decoded uint8 frames, no Wan VAE needed
    ("cosmos", r"Failed to import Wan2pt1VAEInterface"),
    ("cosmos", r"^Config checked successfully$"),
    # the optimizer table cosmos-rl logs as a trainer is built (4 lines for one model part)
    ("cosmos", r"^Total number of trainable parameters: \d+$"),
    ("cosmos", r"^model_part +\| optimizer_cls +\| lr +\|"),
    ("cosmos", r"^-+(-\+-+){5}$"),
    ("cosmos", r"^part_\d+ +\| \S+ +\| \S+ +\| \d+ +\| \d+ +\| (TRAINABLE|FROZEN) *$"),
    ("diffusers.quantizers.torchao.torchao_quantizer", r"^Unable to import `torchao` Tensor objects"),
    # a dtype cast of a model with no float32-only modules (the list is empty: nothing to keep)
    ("diffusers.models.modeling_utils", r"^There are modules in \w+ that should be kept in float32: \[\]\."),
)
#: Python warnings hidden likewise: (category, regular expression of the message).
HARMLESS_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"The pynvml package is deprecated"),  # torch.cuda's import of pynvml
    # peft: the rollout's "old" adapter is added beside "default" on purpose (Diffusion-NFT)
    (UserWarning, r"Already found a `peft_config` attribute in the model"),
)
#: Modules that print a line per import to stdout (cosmos-rl's model auto-discovery).
CHATTY_IMPORTS: frozenset[str] = frozenset({"cosmos_rl.policy.model"})


class MessageFilter(logging.Filter):
    """Drops records whose message matches one of ``patterns``."""

    def __init__(self, patterns: list[str]) -> None:
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


class _SilentLoader(importlib.abc.Loader):
    """Runs another loader with stdout swallowed (the module's import-time prints)."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.inner.exec_module(module)

    def __getattr__(self, name: str):  # get_source, get_resource_reader, ... of the real loader
        return getattr(self.inner, name)


class _SilentImportFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`CHATTY_IMPORTS` with the other finders and silences their loaders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in CHATTY_IMPORTS:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _SilentImportFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _SilentLoader(spec.loader)
                return spec
        return None


_quiet_installed = False


def quiet_third_party() -> None:
    """Hide the known-harmless third-party messages above for the rest of this process.

    Only those: any other record or warning of any package, and everything of
    cosmos-sana's own, still shows. Call it before the packages are imported
    (their first messages come at import time). Idempotent.
    """
    global _quiet_installed
    if _quiet_installed:
        return
    by_logger: dict[str, list[str]] = {}
    for name, pattern in HARMLESS_RECORDS:
        by_logger.setdefault(name, []).append(pattern)
    for name, patterns in by_logger.items():
        logging.getLogger(name).addFilter(MessageFilter(patterns))
    for category, pattern in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    sys.meta_path.insert(0, _SilentImportFinder())
    _quiet_installed = True
