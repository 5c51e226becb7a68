"""Facts about a diffusers pipeline folder (``model_index.json`` + one folder per component)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError

MODEL_INDEX = "model_index.json"
TRANSFORMER = "transformer"
_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def is_pipeline_folder(path: str | Path) -> bool:
    return (Path(path) / MODEL_INDEX).is_file()


def model_index(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / MODEL_INDEX
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: not a diffusers pipeline folder (no {MODEL_INDEX})") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc})") from exc


def component_names(folder: str | Path) -> list[str]:
    """The components ``model_index.json`` lists with a class (optional ones set to null are absent)."""
    return sorted(k for k, v in model_index(folder).items()
                  if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[1] is not None)


def pipeline_class_name(folder: str | Path) -> str:
    return model_index(folder)["_class_name"]


def transformer_class(folder: str | Path) -> type:
    """The diffusers class of the pipeline's ``transformer`` component."""
    import diffusers

    entry = model_index(folder).get(TRANSFORMER)
    if not entry or entry[0] != "diffusers":
        raise CheckpointError(f"{folder}/{MODEL_INDEX}: no diffusers 'transformer' component (got {entry!r})")
    return getattr(diffusers, entry[1])


def stored_dtype(model_folder: str | Path) -> torch.dtype:
    """The dtype of the first tensor in a diffusers model folder's safetensors."""
    from safetensors import safe_open

    files = sorted(Path(model_folder).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_folder}: no .safetensors weights")
    with safe_open(str(files[0]), framework="pt") as handle:
        first = next(iter(handle.keys()))
        code = handle.get_slice(first).get_dtype()
    return _SAFETENSORS_DTYPES[code]


def load_transformer(folder: str | Path, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The pipeline's transformer in its stored dtype (or ``dtype``), on CPU."""
    folder = Path(folder)
    cls = transformer_class(folder)
    dtype = dtype or stored_dtype(folder / TRANSFORMER)
    return cls.from_pretrained(str(folder), subfolder=TRANSFORMER, torch_dtype=dtype).eval()
