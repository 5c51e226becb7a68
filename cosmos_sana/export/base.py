"""The base transformer a run trained on, rebuilt for export the way training built it.

Training starts from the pipeline's own transformer (``policy.model_name_or_path``), replaced by a
native checkpoint's weights when ``[custom.model] native_checkpoint`` is set, then overwritten by a
DCP model when ``[custom.checkpoint] init_from`` is set. A LoRA checkpoint holds only the adapters,
so merging, verifying or describing it needs that same base; the run's resolved config
(``run_config.json`` in every training checkpoint) says which it was. The base is rebuilt at the
precision its files store (training may have held it at ``policy.diffusers.dtype``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError, read_metadata
from cosmos_sana.checkpoint.pipeline_folder import load_transformer, pipeline_class_name
from cosmos_sana.checkpoint.training import MODEL_PART, RUN_CONFIG_FILE, read_run_config
from cosmos_sana.model_hooks import model_tool

#: ``native_checkpoint`` sources with this prefix are fetched from the Hugging Face Hub, not hashed here.
REMOTE_PREFIX = "hf://"
NATIVE_KEY = "custom.model.native_checkpoint"
INIT_KEY = "custom.checkpoint.init_from"
#: the export options that give a recorded path's new place (a run copied to another machine)
RELOCATION_FLAGS = {NATIVE_KEY: "--native-checkpoint", INIT_KEY: "--init-from"}
#: the entry of ``describe()`` each setting fills
MANIFEST_FIELDS = {NATIVE_KEY: "native_checkpoint", INIT_KEY: "init_from"}
_HASH_CHUNK = 1 << 24


@dataclass(frozen=True)
class BaseWeights:
    """Where the base weights come from: ``pipeline`` (architecture, and weights unless replaced),
    ``native_checkpoint`` (a native source as the run config spelled it), ``init_from`` (a DCP folder)."""

    pipeline: Path
    native_checkpoint: str | None = None
    native_use_ema: bool = False
    init_from: Path | None = None
    #: where the native / init settings were read (named in errors)
    recorded_in: Path | None = None
    #: ``(setting, recorded value)`` of each path given anew with a :data:`RELOCATION_FLAGS` option
    moved: tuple[tuple[str, str], ...] = ()

    def relocated(self, *, native_checkpoint: str | None = None, init_from: str | Path | None = None) -> BaseWeights:
        """This base with its native checkpoint and/or ``init_from`` folder read from a new place."""
        base = self
        if native_checkpoint is not None:
            base = replace(base._moving(NATIVE_KEY, self.native_checkpoint), native_checkpoint=str(native_checkpoint))
        if init_from is not None:
            base = replace(base._moving(INIT_KEY, self.init_from), init_from=Path(init_from).expanduser())
        return base

    def _moving(self, key: str, recorded: str | Path | None) -> BaseWeights:
        if recorded is None:
            where = f"not set in {self.recorded_in}" if self.recorded_in else "no run_config.json"
            raise CheckpointError(f"{RELOCATION_FLAGS[key]}: the run did not use {key} ({where})")
        return replace(self, moved=(*self.moved, (key, str(recorded))))

    @property
    def weight_paths(self) -> list[Path]:
        """The local native checkpoint and ``init_from`` folder this base reads, if any."""
        paths = []
        if self.native_checkpoint and not self.native_checkpoint.startswith(REMOTE_PREFIX):
            paths.append(Path(self.native_checkpoint).expanduser())
        if self.init_from is not None:
            paths.append(self.init_from)
        return paths

    def build(self) -> torch.nn.Module:
        """The base transformer on CPU, each weight in the dtype it is stored in."""
        if self.native_checkpoint:
            transformer = self._load_native()
        else:
            transformer = load_transformer(self.pipeline)
        if self.init_from is not None:
            from cosmos_sana.checkpoint.convert import load_model_weights

            try:
                transformer.to(stored_dcp_dtype(_init_model_dir(self.init_from)))
                load_model_weights(self.init_from, transformer)
            except CheckpointError as exc:
                raise CheckpointError(f"{self._origin(INIT_KEY)}: {exc}") from exc
        return transformer.eval()

    def _load_native(self) -> torch.nn.Module:
        try:
            loader = model_tool(pipeline_class_name(self.pipeline), "native_loader")
            return loader(self.native_checkpoint, base_config=str(self.pipeline), use_ema=self.native_use_ema,
                          torch_dtype=None)
        except (RuntimeError, ValueError, OSError) as exc:  # NoModelTool is a ValueError
            raise CheckpointError(
                f"{self._origin(NATIVE_KEY)} {self.native_checkpoint}: {exc}"
            ) from exc

    def _origin(self, key: str) -> str:
        if key in dict(self.moved):
            return RELOCATION_FLAGS[key]
        return f"{key} (recorded in {self.recorded_in})" if self.recorded_in else key

    def describe(self) -> dict[str, Any]:
        """The manifest entry: enough to rebuild (and check) this base elsewhere."""
        entry: dict[str, Any] = {
            "pipeline": str(self.pipeline.resolve()),
            "pipeline_class": pipeline_class_name(self.pipeline),
            "native_checkpoint": None,
            "init_from": None,
        }
        if self.native_checkpoint:
            entry["native_checkpoint"] = {
                "source": self.native_checkpoint,
                "use_ema": self.native_use_ema,
                **({} if self.native_checkpoint.startswith(REMOTE_PREFIX)
                   else fingerprint(Path(self.native_checkpoint).expanduser())),
            }
        if self.init_from is not None:
            entry["init_from"] = {"source": str(self.init_from), **fingerprint(_init_model_dir(self.init_from))}
        for key, recorded in self.moved:
            entry[MANIFEST_FIELDS[key]]["recorded_source"] = recorded
        return entry


def recorded_base(checkpoint: Path, pipeline: Path) -> BaseWeights:
    """The base ``checkpoint``'s run trained on, on the pipeline folder ``pipeline``.

    Checkpoints without a ``run_config.json`` (``convert-to-dcp`` output) or whose run set neither
    option were trained on ``pipeline``'s own transformer.
    """
    path = checkpoint / RUN_CONFIG_FILE
    if not path.is_file():
        return BaseWeights(pipeline=pipeline)
    custom = read_run_config(checkpoint).get("custom") or {}
    model = custom.get("model") or {}
    init_from = (custom.get("checkpoint") or {}).get("init_from")
    return BaseWeights(
        pipeline=pipeline,
        native_checkpoint=model.get("native_checkpoint") or None,
        native_use_ema=bool(model.get("native_use_ema", False)),
        init_from=Path(init_from).expanduser() if init_from else None,
        recorded_in=path,
    )


def fingerprint(path: Path) -> dict[str, Any]:
    """``path`` (resolved), its size and sha256: of the file, or for a folder of the lines
    ``<sha256>  <relative path>`` of its files in sorted order (what ``sha256sum`` prints).
    A missing path is recorded as such (a full-weight checkpoint exports without its base)."""
    if not path.exists():
        return {"path": str(path), "found": False}
    if path.is_file():
        return {"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": _sha256(path)}
    files = sorted(p for p in path.rglob("*") if p.is_file())
    listing = "".join(f"{_sha256(p)}  {p.relative_to(path).as_posix()}\n" for p in files)
    return {
        "path": str(path.resolve()),
        "bytes": sum(p.stat().st_size for p in files),
        "files": len(files),
        "sha256": hashlib.sha256(listing.encode()).hexdigest(),
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _init_model_dir(folder: Path) -> Path:
    """The DCP folder ``load_model_weights`` reads for ``init_from``."""
    return folder / MODEL_PART if (folder / MODEL_PART).is_dir() else folder


def stored_dcp_dtype(folder: Path) -> torch.dtype:
    """The dtype of the first floating-point tensor in the DCP folder ``folder``."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for entry in read_metadata(folder).state_dict_metadata.values():
        if isinstance(entry, TensorStorageMetadata) and entry.properties.dtype.is_floating_point:
            return entry.properties.dtype
    raise CheckpointError(f"{folder}: holds no floating-point tensors")
