"""Read and write native SANA transformer checkpoints (``.pth``, ``.safetensors``, sharded index).

Sources: ``hf://org/repo/path/in/repo`` (Hugging Face Hub, honours ``HF_HUB_OFFLINE``), a local file or
folder, or — when no source is given — the env var :data:`ENV_SOURCE`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError
from cosmos_sana.log import get_logger
from cosmos_sana_plugins.sana.native_keys import (
    IMAGE_CLASS,
    VIDEO_CLASS,
    NativeKeyError,
    architecture_name,
    diffusers_to_native,
    has_linear_ffn,
    infer_transformer_config,
    is_video_native,
    native_to_diffusers,
)

log = get_logger(__name__)

ENV_SOURCE = "SANA_NATIVE_MODEL_PATH"
HF_SCHEME = "hf://"
_INDEX_SUFFIX = ".safetensors.index.json"
_TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


class NativeCheckpointError(CheckpointError):
    """A native checkpoint cannot be found, read or mapped; the message names the file or key."""


# --------------------------------------------------------------------------- locating


def resolve_source(source: str | os.PathLike[str] | None) -> Path:
    """Local path of a native checkpoint: ``hf://…``, a file or folder, or None (then the env var)."""
    if source is None or str(source) == "":
        source = os.environ.get(ENV_SOURCE)
        if not source:
            raise NativeCheckpointError(f"no native checkpoint given and ${ENV_SOURCE} is not set")
    text = str(source)
    if text.startswith(HF_SCHEME):
        return _download(text)
    path = Path(text).expanduser()
    if not path.exists():
        raise NativeCheckpointError(f"native checkpoint not found: {path}")
    return _pick_in_folder(path) if path.is_dir() else path


def _pick_in_folder(folder: Path) -> Path:
    indexes = sorted(folder.glob(f"*{_INDEX_SUFFIX}"))
    if len(indexes) == 1:
        return indexes[0]
    singles = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", *_TORCH_SUFFIXES))
    if not indexes and len(singles) == 1:
        return singles[0]
    found = ", ".join(p.name for p in (indexes or singles)) or "nothing"
    raise NativeCheckpointError(
        f"{folder}: expected one checkpoint file or one *{_INDEX_SUFFIX}, found {found}; name the file"
    )


def _download(url: str) -> Path:
    parts = url[len(HF_SCHEME) :].split("/")
    if len(parts) < 3 or not all(parts):
        raise NativeCheckpointError(f"{url}: expected hf://ORG/REPO/PATH/TO/FILE")
    repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    local = Path(_hub_file(repo_id, filename, url))
    if filename.endswith(_INDEX_SUFFIX):
        folder = filename.rpartition("/")[0]
        for shard in sorted(set(_read_index(local).values())):
            _hub_file(repo_id, f"{folder}/{shard}" if folder else shard, url)
    return local


def _hub_file(repo_id: str, filename: str, url: str) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return hf_hub_download(repo_id=repo_id, filename=filename)
    except LocalEntryNotFoundError as exc:
        raise NativeCheckpointError(
            f"{url}: '{filename}' of {repo_id} is not in the local Hugging Face cache and the Hub cannot be reached"
            f" (HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}). Download it where there is network:"
            f" `huggingface-cli download {repo_id} {filename}`, then copy the cache (HF_HOME) here,"
            f" or pass a local path / set ${ENV_SOURCE}."
        ) from exc


# --------------------------------------------------------------------------- reading


def read_native_state_dict(path: str | os.PathLike[str], *, use_ema: bool = False) -> dict[str, torch.Tensor]:
    """The transformer tensors of a native checkpoint file (``use_ema`` picks ``state_dict_ema``)."""
    path = Path(path)
    name = path.name
    if name.endswith(_INDEX_SUFFIX):
        tensors = _read_sharded(path)
    elif name.endswith(".safetensors"):
        from safetensors.torch import load_file

        tensors = load_file(path)
    elif name.endswith(_TORCH_SUFFIXES):
        return _pick_state_dict(_torch_load(path), path, use_ema)
    else:
        raise NativeCheckpointError(f"{path}: unsupported checkpoint type (use .pth, .safetensors or {_INDEX_SUFFIX})")
    if use_ema:
        raise NativeCheckpointError(f"{path}: EMA weights requested but a safetensors file holds one state dict")
    return tensors


def _read_index(index: Path) -> dict[str, str]:
    """The index's ``weight_map``; each shard must be a file name beside the index."""
    try:
        weight_map = dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NativeCheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({exc})") from exc
    outside = [s for s in dict.fromkeys(weight_map.values())
               if not isinstance(s, str) or Path(s).name != s or s in ("", ".", "..")]
    if outside:
        raise NativeCheckpointError(f"{index}: shards must be file names beside the index, got {outside}")
    return weight_map


def _read_sharded(index: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weight_map = _read_index(index)
    missing = sorted({s for s in weight_map.values() if not (index.parent / s).is_file()})
    if missing:
        raise NativeCheckpointError(f"{index}: shard file(s) missing next to the index: {', '.join(missing)}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(load_file(index.parent / shard))
    absent = sorted(set(weight_map) - set(tensors))
    if absent:
        raise NativeCheckpointError(f"{index}: keys listed in the index but not in their shard: {', '.join(absent)}")
    return {k: tensors[k] for k in weight_map}


def _numpy_array_globals() -> list[Any]:
    """Globals needed to unpickle plain NumPy arrays (native checkpoints keep NumPy RNG state)."""
    import numpy
    import numpy.dtypes

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy < 2
        from numpy.core.multiarray import _reconstruct
    return [numpy.ndarray, numpy.dtype, _reconstruct, *(getattr(numpy.dtypes, n) for n in numpy.dtypes.__all__)]


def _torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True)``, also accepting NumPy arrays (never arbitrary objects)."""
    import pickle

    with open(path, "rb") as handle:
        head = handle.read(4)
    if not (head.startswith(_ZIP_MAGIC) or head[:1] == _PICKLE_PROTO):
        raise NativeCheckpointError(
            f"{path}: not a torch checkpoint (starts with {head!r}; torch.save writes a zip archive or a pickle)"
        )
    with torch.serialization.safe_globals(_numpy_array_globals()):
        try:
            try:  # mmap keeps optimizer state and other unused entries out of memory
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
        except pickle.UnpicklingError as exc:
            raise NativeCheckpointError(f"{path}: refused to unpickle a non-tensor object ({_refusal(exc)})") from exc
        except (RuntimeError, EOFError, ValueError, KeyError, IndexError) as exc:  # truncated or corrupt data
            raise NativeCheckpointError(f"{path}: not a readable torch checkpoint ({type(exc).__name__}: {exc})") from exc


#: first bytes of what ``torch.save`` writes: a zip archive (torch >= 1.6) or a pickle (legacy format)
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = b"\x80"


def _refusal(exc: Exception) -> str:
    """The line of torch's weights-only refusal that names the global, else the whole message."""
    text = str(exc)
    return next((line.strip() for line in text.splitlines() if "Unsupported global" in line), text)


def _pick_state_dict(data: Any, path: Path, use_ema: bool) -> dict[str, torch.Tensor]:
    if not isinstance(data, Mapping):
        raise NativeCheckpointError(f"{path}: expected a dict, found {type(data).__name__}")
    if use_ema:
        if "state_dict_ema" not in data:
            raise NativeCheckpointError(
                f"{path}: --ema/use_ema asked for 'state_dict_ema' but the file has only: {', '.join(map(str, data))}"
            )
        chosen = data["state_dict_ema"]
    else:
        if "state_dict_ema" in data and "state_dict" not in data:
            raise NativeCheckpointError(f"{path}: has 'state_dict_ema' but no 'state_dict'; pass use_ema/--ema")
        chosen = data.get("state_dict", data)
    not_tensors = sorted(str(k) for k, v in chosen.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise NativeCheckpointError(f"{path}: state dict entries that are not tensors: {', '.join(not_tensors)}")
    return dict(chosen)


# --------------------------------------------------------------------------- diffusers transformer


def load_native_transformer(
    source: str | os.PathLike[str] | None,
    *,
    base_config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    use_ema: bool = False,
    torch_dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """A diffusers SANA transformer holding the weights of a native checkpoint.

    ``base_config``: a diffusers transformer config (dict, ``config.json``, a transformer folder or a
    pipeline folder). Without it the architecture is inferred from tensor shapes (known SANA widths only).
    Loading is strict: missing, unexpected or mis-shaped keys raise :class:`NativeCheckpointError`.
    """
    import diffusers
    from accelerate import init_empty_weights

    path = resolve_source(source)
    native = read_native_state_dict(path, use_ema=use_ema)
    try:
        class_name, config = (
            _config_from(base_config, native) if base_config is not None else infer_transformer_config(native)
        )
        tensors = native_to_diffusers(native)
    except NativeKeyError as exc:
        raise NativeCheckpointError(f"{path}: {exc}") from exc
    with init_empty_weights():
        model = getattr(diffusers, class_name).from_config(config)
    _check_keys(model, tensors, path)
    model.load_state_dict(tensors, strict=True, assign=True)
    if torch_dtype is not None:
        model.to(dtype=torch_dtype)
    log.info("loaded %s (%s%s) from %s", class_name, architecture_name(native), ", EMA" if use_ema else "", path)
    return model.eval()


def _config_from(base: Mapping[str, Any] | str | os.PathLike[str], native: Mapping[str, Any]) -> tuple[str, dict]:
    if isinstance(base, Mapping):
        config = dict(base)
    else:
        folder = Path(base)
        candidates = [folder, folder / "config.json", folder / "transformer" / "config.json"]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise NativeCheckpointError(f"{base}: no transformer config.json (looked in {folder} and transformer/)")
        config = json.loads(found.read_text(encoding="utf-8"))
    wanted = VIDEO_CLASS if is_video_native(native) else IMAGE_CLASS
    class_name = config.get("_class_name", wanted)
    if class_name != wanted:
        raise NativeCheckpointError(f"base config is a {class_name} but the native checkpoint holds a {wanted}")
    return class_name, {k: v for k, v in config.items() if not k.startswith("_")}


def _check_keys(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mis_shaped = sorted(
        f"{k}: checkpoint {tuple(tensors[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(tensors)
        if tensors[k].shape != expected[k].shape
    )
    problems = [f"missing from checkpoint: {k}" for k in missing]
    problems += [f"not in the model: {k}" for k in unexpected]
    problems += [f"shape mismatch {k}" for k in mis_shaped]
    if problems:
        listed = "".join(f"\n  {p}" for p in problems)
        raise NativeCheckpointError(f"{path}: checkpoint does not fit {type(model).__name__}:{listed}")


# --------------------------------------------------------------------------- writing


def save_native(
    transformer: torch.nn.Module,
    path: str | os.PathLike[str],
    *,
    linear_ffn: bool = False,
    layout_of: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``transformer``'s weights in native layout: ``.safetensors``, or ``.pth`` as ``{"state_dict": …}``.

    ``layout_of``: a native checkpoint whose FFN form (conv, or LinearFFN) to write instead of ``linear_ffn``
    (the checkpoint a run started from, so its tools load the result); unreadable, it is named in a warning.
    """
    path = Path(path)
    if layout_of is not None:
        try:
            linear_ffn = has_linear_ffn(read_native_state_dict(resolve_source(layout_of)))
        except NativeCheckpointError as exc:
            log.warning("writing %s with conv FFN layers: the layout of %s is unknown (%s)", path, layout_of, exc)
    tensors = {k: v.detach().cpu().contiguous() for k, v in transformer.state_dict().items()}
    native = diffusers_to_native(tensors, linear_ffn=linear_ffn)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(native, path, metadata={"format": "pt"})
    elif path.name.endswith(_TORCH_SUFFIXES):
        torch.save({"state_dict": native}, path)
    else:
        raise NativeCheckpointError(f"{path}: choose a .safetensors or .pth file name")
    return path


# --------------------------------------------------------------------------- pipeline folder


def convert_to_pipeline(
    source: str | os.PathLike[str] | None,
    *,
    base: str | os.PathLike[str],
    out: str | os.PathLike[str],
    use_ema: bool = False,
    torch_dtype: torch.dtype | None = None,
) -> Path:
    """Write a diffusers pipeline folder: the transformer from a native checkpoint, all else copied from ``base``."""
    import shutil

    base, out = Path(base), Path(out)
    index = base / "model_index.json"
    if not index.is_file():
        raise NativeCheckpointError(f"--base {base}: not a diffusers pipeline folder (no model_index.json)")
    if out.exists() and any(out.iterdir()):
        raise NativeCheckpointError(f"--out {out}: exists and is not empty; choose a new folder")
    transformer = load_native_transformer(source, base_config=base, use_ema=use_ema, torch_dtype=torch_dtype)
    out.mkdir(parents=True, exist_ok=True)
    for entry in base.iterdir():
        if entry.name in ("transformer", ".cache") or entry.name.startswith(".git"):
            continue
        copy = shutil.copytree if entry.is_dir() else shutil.copy2
        copy(entry, out / entry.name)
    transformer.save_pretrained(out / "transformer", safe_serialization=True)
    log.info("wrote %s (transformer from %s, rest from %s)", out, source or f"${ENV_SOURCE}", base)
    return out
