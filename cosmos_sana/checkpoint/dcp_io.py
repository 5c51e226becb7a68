"""Reading and writing one DCP (``torch.distributed.checkpoint``) folder.

Works in a single process without a process group (CPU tools, tests) and
collectively on every rank of an initialised group (FSDP / DTensor state is
written as shards and re-sharded on load, so the rank count may change).
"""

from __future__ import annotations

import contextvars
import dataclasses
import io
import math
import pickle
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.tensor import DTensor

METADATA_FILE = ".metadata"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match what is being loaded."""


_rank_local = contextvars.ContextVar("cosmos_sana_dcp_rank_local", default=False)


@contextmanager
def rank_local() -> Iterator[None]:
    """Inside, DCP reads and writes involve this process alone, even in a distributed job
    (rank 0 exporting the checkpoint every rank just wrote must not start a collective)."""
    token = _rank_local.set(True)
    try:
        yield
    finally:
        _rank_local.reset(token)


def is_distributed() -> bool:
    return not _rank_local.get() and dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` without a process group."""
    if is_distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor entries must unpickle under ``weights_only=True``.

    DCP stores every non-tensor value (ints, lists, strings…) as a pickle and loads
    it with full unpickling; a tampered checkpoint could run code. Here each such entry
    is unpickled once, by torch's restricted unpickler, and that result is what is stored
    (a second, full unpickling of the same bytes could read them differently).
    A refusal names the checkpoint ``folder`` and the entry.
    """

    def __init__(self, folder: str | Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.folder = folder

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as exc:  # the restricted unpickler raises UnpicklingError or RuntimeError
            text = str(exc)
            reason = next((line.strip() for line in text.splitlines() if "Unsupported global" in line), text)
            raise CheckpointError(
                f"{self.folder}: entry {read_item.dest_index.fqn!r} is not plain data "
                f"(refused by weights_only loading: {reason})"
            ) from exc
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:  # where DefaultLoadPlanner.load_bytes puts the value
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


#: the only globals a DCP ``.metadata`` pickle may name: DCP's own metadata records and the
#: plain values inside them (shapes, dtypes, layouts, memory formats, the checkpoint path)
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global outside the allow-list."""


class _MetadataUnpickler(pickle._Unpickler):
    """Unpickles a DCP ``.metadata`` admitting only :data:`_METADATA_GLOBALS` and torch dtypes;
    any other global (``os.system``, a class with a hostile ``__reduce__``…) is refused unloaded.

    Restricting globals alone is not enough: pickle's BUILD opcode sets attributes on whatever
    object is on the stack, and an allowed class is such an object (``BUILD`` on ``PosixPath``
    with ``_str`` would make every path in the process print as an attacker's path). BUILD is
    therefore only admitted on instances of DCP's metadata dataclasses, which is all DCP writes.
    This is pickle's pure-Python unpickler, the only one whose opcodes can be overridden;
    a metadata file is small, so its speed does not matter.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _RefusedGlobal(f"global {module}.{name} is not DCP checkpoint metadata")

    def load_build(self) -> None:
        target = self.stack[-2] if len(self.stack) >= 2 else None
        kind = type(target)
        if not (dataclasses.is_dataclass(kind) and (kind.__module__, kind.__qualname__) in _METADATA_GLOBALS):
            named = target if isinstance(target, type) else kind
            what = "the class" if isinstance(target, type) else "a"
            raise _RefusedGlobal(f"setting attributes of {what} {named.__module__}.{named.__qualname__} "
                                 "is not DCP checkpoint metadata")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def read_metadata_file(path: str | Path) -> Metadata:
    """The DCP ``Metadata`` pickled in ``path``, read with :class:`_MetadataUnpickler`.

    torch's ``FileSystemReader`` unpickles this file with plain ``pickle``, so a crafted
    ``.metadata`` would run code on load; this never does. Storage entries must name data
    files inside the checkpoint folder.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except _RefusedGlobal as exc:
        raise CheckpointError(f"{path}: refused to load checkpoint metadata ({exc})") from exc
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint metadata ({exc})") from exc
    except Exception as exc:  # truncated or corrupt pickles raise many kinds of errors
        raise CheckpointError(f"{path}: corrupt checkpoint metadata ({type(exc).__name__}: {exc})") from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path}: not DCP checkpoint metadata (holds a {type(metadata).__name__})")
    for info in (metadata.storage_data or {}).values():
        relative = getattr(info, "relative_path", None)
        if not isinstance(relative, str) or not relative or Path(relative).name != relative or relative in (".", ".."):
            raise CheckpointError(f"{path}: names data file {relative!r} outside its checkpoint folder")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """torch's ``FileSystemReader`` with ``.metadata`` read by :func:`read_metadata_file`.

    Every DCP read in this package goes through it; tensors themselves are read by torch
    with ``weights_only=True`` and other entries are checked by :class:`SafeLoadPlanner`.
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata_file(self._get_metadata_path(kwargs.get("rank")))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_metadata(folder: str | Path) -> Metadata:
    """The DCP metadata of the checkpoint folder ``folder`` (safely unpickled)."""
    folder = Path(folder)
    if not (folder / METADATA_FILE).is_file():
        raise CheckpointError(f"{folder}: not a DCP checkpoint (no {METADATA_FILE})")
    return read_metadata_file(folder / METADATA_FILE)


def non_finite_entry(state: Any, prefix: str = "") -> str | None:
    """The flattened key of the first floating-point tensor in ``state`` holding NaN or inf
    (this rank's shard of a DTensor), or None."""
    if isinstance(state, torch.Tensor):
        local = state.to_local() if isinstance(state, DTensor) else state
        finite = not local.is_floating_point() or bool(torch.isfinite(local).all())
        return None if finite else prefix or "<tensor>"
    if isinstance(state, Mapping):
        items = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return None
    for key, value in items:
        found = non_finite_entry(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


def any_rank(flag: bool) -> bool:
    """``flag`` or-ed over every rank (collective in a distributed job)."""
    if not is_distributed():
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _tensors(state: Any) -> Iterator[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        yield state.to_local() if isinstance(state, DTensor) else state
    elif isinstance(state, Mapping):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value)


@contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns on every single-process call that no process group exists; that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def file_count(state: Mapping[str, Any], chunk_bytes: int | None) -> int:
    """DCP data files for this rank so that each holds about ``chunk_bytes``."""
    tensors = list(_tensors(state))
    if not chunk_bytes or not tensors:
        return 1
    total = sum(t.numel() * t.element_size() for t in tensors)
    return max(1, min(len(tensors), math.ceil(total / chunk_bytes)))


def save_state(state: Mapping[str, Any], path: str | Path, *, chunk_bytes: int | None = None) -> None:
    """Write ``state`` (nested dicts of tensors and plain values) as DCP into ``path``.

    Collective when a process group is initialised. Each rank's share is split
    into files of about ``chunk_bytes`` (one file when unset).
    """
    writer = FileSystemWriter(
        str(path), single_file_per_rank=True, thread_count=file_count(state, chunk_bytes), sync_files=True
    )
    with _single_process_quiet():
        dcp.save(dict(state), storage_writer=writer, no_dist=not is_distributed())


def stored_keys(path: str | Path) -> set[str]:
    """Flattened keys stored in the DCP folder ``path`` (``a.b.c`` for nested dicts)."""
    return set(read_metadata(path).state_dict_metadata)


def load_state(state: dict[str, Any], path: str | Path) -> None:
    """Fill ``state`` in place from the DCP folder ``path`` (tensors are copied into, others replaced)."""
    path = Path(path)
    metadata = read_metadata(path)
    stored = set(metadata.state_dict_metadata)
    check_data_files(path, metadata)
    try:
        with _single_process_quiet():
            dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner(path), no_dist=not is_distributed())
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        if isinstance(_first_failure(exc), CheckpointError):  # SafeLoadPlanner's refusal names folder and entry
            raise _first_failure(exc) from exc
        sample = ", ".join(sorted(stored)[:5])
        raise CheckpointError(f"{path}: cannot load ({_reason(exc)}); stored keys include: {sample}") from exc


def check_data_files(path: Path, metadata: Metadata) -> None:
    """Every data file the metadata points into exists and is long enough; a truncated shard
    (an interrupted copy) is named instead of failing inside DCP's reader."""
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: cannot load: data file {name} is missing (the checkpoint is incomplete)")
        size = file.stat().st_size
        if size < end:
            raise CheckpointError(f"{file}: cannot load: truncated to {size} bytes, the checkpoint's metadata "
                                  f"needs {end}")


def _first_failure(exc: BaseException) -> BaseException:
    """The first rank's underlying error of a DCP ``CheckpointException``, else ``exc``."""
    if isinstance(exc, CheckpointException) and exc.failures:
        return next(iter(exc.failures.values()))[0]
    return exc


def _reason(exc: BaseException) -> str:
    """The first rank's underlying error of a DCP ``CheckpointException``, with its type
    (several of the reader's errors have no message of their own)."""
    exc = _first_failure(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
