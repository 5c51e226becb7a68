"""Local files a recipe names, checked before a launch, each problem with the step that fixes it.

A run otherwise finds a missing model folder, dataset, DCP start point or native checkpoint only
after its workers have started (minutes in). Hub ids (``org/name``), ``hf://`` sources and
``builtin:`` prompt sets are not local and are left to the component that reads them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cosmos_sana.value_rules import lookup

#: what ``from_pretrained`` takes as a Hub repository id rather than a folder
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WAN_VAE_CLASS = "AutoencoderKLWan"
DATA_FIELDS = ("data", "real_data", "val_data")


def is_local_model(name: str) -> bool:
    """True when ``name`` is a folder path, not a Hub id ``org/name`` (an existing folder wins, as in diffusers)."""
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or not HUB_ID.match(name)


def is_remote(path: str) -> bool:
    return path.startswith("builtin:") or "://" in path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _where(path: str) -> str:
    return "" if Path(path).is_absolute() else f" (relative to {Path.cwd()})"


def pipeline_file(name: str, relative: str) -> Path | None:
    """``relative`` (``vae/config.json``) of a pipeline: from its folder, or for a Hub id from the
    local Hugging Face cache (never the network); None when not on this machine."""
    if is_local_model(name):
        file = Path(name).expanduser() / relative
        return file if file.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(name, relative)
    return Path(cached) if isinstance(cached, str) else None


def pipeline_spatial_grid(name: str) -> int | None:
    """Pixels per latent token along height/width (VAE downsampling × transformer patch) of the
    diffusers pipeline ``name`` (a folder, or a Hub id in the local cache); None when unknown."""
    configs = [pipeline_file(name, f) for f in ("model_index.json", "transformer/config.json", "vae/config.json")]
    if any(file is None for file in configs):
        return None
    index, transformer, vae = (_read_json(file) for file in configs)
    if index is None or transformer is None or vae is None:
        return None
    if "Video" in str(index.get("_class_name", "")):
        vae_factor = vae.get("scale_factor_spatial", vae.get("spatial_compression_ratio"))
    else:
        blocks = vae.get("encoder_block_out_channels", vae.get("block_out_channels"))
        vae_factor = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else None
    patch = transformer.get("patch_size", 1)
    patch = patch[-1] if isinstance(patch, list) and patch else patch
    if not isinstance(vae_factor, int) or not isinstance(patch, int):
        return None
    return vae_factor * patch


def model_issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The pipeline folder ``policy.model_name_or_path`` (when local) and what it must contain."""
    name = lookup(data, "policy.model_name_or_path")
    if not isinstance(name, str) or not name or not is_local_model(name):
        return []
    key, folder = "policy.model_name_or_path", Path(name).expanduser()
    fix = (f"download the pipeline (huggingface-cli download ORG/REPO --local-dir {name}) or build a tiny "
           f"random one with `cosmos-sana make-tiny --out {name}`")
    if not folder.is_dir():
        return [(key, f"{name!r}: no such folder{_where(name)}; {fix}")]
    index = _read_json(folder / "model_index.json")
    if index is None:
        return [(key, f"{name!r} is not a diffusers pipeline folder (no readable model_index.json); {fix}")]
    found = []
    for component, entry in index.items():
        if not component.startswith("_") and isinstance(entry, list) and entry[0] and not (folder / component).is_dir():
            found.append((key, f"{name!r}: model_index.json names {component}/ but the folder is missing; {fix}"))
    is_video = lookup(data, "policy.diffusers.is_video")
    vae = index.get("vae")
    if is_video is True and isinstance(vae, list) and len(vae) == 2 and vae[1] != WAN_VAE_CLASS:
        found.append((key, f"{name!r}: vae/ is {vae[1]}, a video pipeline needs the Wan2.1 VAE ({WAN_VAE_CLASS}); "
                           "use a SanaVideoPipeline folder whose vae/ holds it"))
    return found


def inference_size_issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    """``policy.diffusers.inference_size`` against the model's patch × VAE grid (when its
    configs are on this machine: a local folder, or a Hub id in the Hugging Face cache)."""
    size, name = lookup(data, "policy.diffusers.inference_size"), lookup(data, "policy.model_name_or_path")
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
        return []  # absent, or already reported by the value rules
    if not isinstance(name, str) or not name:
        return []
    grid = pipeline_spatial_grid(name)
    if grid is None or (size[0] % grid == 0 and size[1] % grid == 0):
        return []
    return [("policy.diffusers.inference_size",
             f"{size}: height and width must be multiples of {grid} (this model's VAE downsampling × patch size)")]


def dataset_issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every ``[custom.<data>] args.path``; the validation set's only when validation is on."""
    missing: dict[str, list[str]] = {}  # path → the keys naming it (training and validation data may share one)
    validating = lookup(data, "validation.enable") is True
    for field in DATA_FIELDS:
        if field == "val_data" and not validating:
            continue
        path = lookup(data, f"custom.{field}.args.path")
        if not isinstance(path, str) or is_remote(path) or Path(path).expanduser().exists():
            continue
        missing.setdefault(path, []).append(f"custom.{field}.args.path")
    return [(keys[0], f"{path!r} does not exist{_where(path)}{_also(keys[1:])}: point it at your data "
                      f"(layouts: README 'Data') and check it with `cosmos-sana data check {path}`")
            for path, keys in missing.items()]


def _also(keys: list[str]) -> str:
    return f" (also the path of {' and '.join(keys)})" if keys else ""


def checkpoint_issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    """``custom.checkpoint.init_from`` (a DCP folder) and ``custom.model.native_checkpoint`` (a local file)."""
    found = []
    init = lookup(data, "custom.checkpoint.init_from")
    if isinstance(init, str) and not (Path(init).expanduser() / "model" / ".metadata").is_file():
        model = lookup(data, "policy.model_name_or_path")
        base = model if isinstance(model, str) else "PIPELINE"
        found.append(("custom.checkpoint.init_from",
                      f"{init!r} has no DCP model/ (model/.metadata){_where(init)}: create it with "
                      f"`cosmos-sana convert-to-dcp {base} --out {init}`"))
    native = lookup(data, "custom.model.native_checkpoint")
    if isinstance(native, str) and not is_remote(native) and not Path(native).expanduser().is_file():
        found.append(("custom.model.native_checkpoint",
                      f"{native!r}: no such file{_where(native)}; give a local .pth/.safetensors/.index.json "
                      "or hf://ORG/REPO/FILE"))
    return found


def path_issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every local path a recipe names that this machine lacks."""
    return model_issues(data) + dataset_issues(data) + checkpoint_issues(data)
