"""PEFT LoRA adapters on a SANA transformer: named adapters, loading, switching, blending, export.

``lora`` arguments are cosmos-rl's ``[policy.lora]`` table (``cosmos_rl.policy.config.LoraConfig``:
``r, lora_alpha, lora_dropout, target_modules, init_lora_weights, use_rslora, lora_names,
primary_adapter, lora_path, r_pattern, alpha_pattern``) or any object with those attributes.

Public API::

    DEFAULT_TARGET_MODULES                  # SANA self- and cross-attention q/k/v/out
    peft_config(lora) -> peft.LoraConfig
    add_adapters(transformer, lora) -> list[str]      # all adapters start equal to the first
    primary_adapter(lora) -> str                      # the trained one
    load_adapter_weights(transformer, path, names, lora) -> None
    activate(transformer, active: str | None, trainable: str | None) -> None
    adapter_parameters(transformer, name) -> dict[str, Parameter]   # keys without the adapter name
    blend_adapter(transformer, src, dst, decay) -> None             # dst ← decay·dst + (1−decay)·src
    trainable_parameters(module) -> list[Parameter]
    adapter_export(transformer, name) -> (state_dict, metadata)     # for SanaPipeline.save_lora_weights
    adapter_scales(transformer, name) -> {module: scale}            # PEFT's lora_alpha / r (or / √r) per module
    save_diffusers_lora(transformer, name, directory) -> Path       # pytorch_lora_weights.safetensors, scale folded

``load_adapter_weights`` reads a diffusers LoRA (``pytorch_lora_weights.safetensors``, keys
``transformer.<module>.lora_A.weight``), a PEFT folder (``adapter_config.json`` +
``adapter_model.safetensors``, keys ``base_model.model.<module>...``) or a cosmos-rl export
(``lora/model.safetensors`` + ``adapter_config.json``). Shapes must match the configured
adapter and the recorded ``r``/``lora_alpha``/``use_rslora`` must equal the config; a file
without that record is what stock diffusers loads with ``lora_alpha = r``.

Portable LoRA files: ``save_diffusers_lora`` folds each module's scale (``lora_alpha / r``, ``/ √r`` with
rsLoRA) into its ``lora_B`` and records ``lora_alpha = r`` (scale 1) for diffusers, so every loader gets the
trained weights: diffusers with its metadata, and a loader that ignores metadata and adds ``lora_B @ lora_A``.
(``.alpha`` tensors are not an option: ``load_lora_weights`` rejects any key without ``"lora"`` in it.)
The trained hyperparameters and the folded scales go in the ``cosmos_sana_lora_folding`` metadata entry,
which ``load_adapter_weights`` reads to unfold them again.
"""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")
WEIGHT_FILES = ("pytorch_lora_weights.safetensors", "adapter_model.safetensors", "model.safetensors")
_KEY_PREFIXES = ("transformer.", "base_model.model.")
_METADATA_KEY = "lora_adapter_metadata"  # diffusers' safetensors metadata entry
#: safetensors metadata entry of a folded file: the trained hyperparameters and ``{module: folded scale}``
FOLDING_KEY = "cosmos_sana_lora_folding"
_HYPERPARAMETERS = ("r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern")


def peft_config(lora: Any) -> Any:
    """A ``peft.LoraConfig`` from cosmos-rl's LoRA table."""
    from peft import LoraConfig

    if getattr(lora, "modules_to_save", None):
        raise ValueError("policy.lora.modules_to_save is not supported for SANA; train full parameters instead")
    target = lora.target_modules if lora.target_modules is not None else list(DEFAULT_TARGET_MODULES)
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=target,
        init_lora_weights=lora.init_lora_weights,
        use_rslora=lora.use_rslora,
        rank_pattern=dict(lora.r_pattern or {}),
        alpha_pattern=dict(lora.alpha_pattern or {}),
    )


def primary_adapter(lora: Any) -> str:
    names = list(lora.lora_names)
    primary = lora.primary_adapter or names[0]
    if primary not in names:
        raise ValueError(f"policy.lora.primary_adapter {primary!r} is not in lora_names {names}")
    return primary


def add_adapters(transformer: torch.nn.Module, lora: Any) -> list[str]:
    """Add every ``lora.lora_names`` adapter; later ones are copies of the first. Freezes the base."""
    names = list(lora.lora_names)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"policy.lora.lora_names must be distinct and non-empty, got {names}")
    config = peft_config(lora)
    transformer.requires_grad_(False)
    with warnings.catch_warnings():  # PEFT warns on every adapter after the first; several are intended
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
        for name in names:
            transformer.add_adapter(config, adapter_name=name)
    for name in names[1:]:
        blend_adapter(transformer, names[0], name, decay=0.0)
    return names


def _tuner_layers(module: torch.nn.Module) -> Iterable[tuple[str, Any]]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    for path, sub in module.named_modules():
        if isinstance(sub, BaseTunerLayer):
            yield path, sub


def adapter_parameters(transformer: torch.nn.Module, name: str) -> dict[str, torch.nn.Parameter]:
    """``{"<module>.lora_A.weight": param, ...}`` of adapter ``name``, in module order."""
    params: dict[str, torch.nn.Parameter] = {}
    for path, layer in _tuner_layers(transformer):
        for layer_name in layer.adapter_layer_names:
            container = getattr(layer, layer_name)
            if name not in container:
                continue
            item = container[name]
            if isinstance(item, torch.nn.Parameter):
                params[f"{path}.{layer_name}"] = item
            else:
                for pname, param in item.named_parameters():
                    params[f"{path}.{layer_name}.{pname}"] = param
    if not params:
        raise KeyError(f"transformer has no LoRA adapter named {name!r}")
    return params


@dataclass(frozen=True)
class _LoraLayout:
    """The LoRA layers of one transformer, found for the ``peft_config`` entries it had then.

    diffusers' ``add_adapter`` / ``delete_adapters`` / ``load_lora_adapter`` / ``unload_lora`` all change
    ``peft_config``, so a layout whose ``(name, config object)`` pairs still match it still names every
    layer; the first layer is also checked to still sit at its path, which catches layers rebuilt under
    the same config objects (e.g. ``unload_lora`` then ``add_adapter`` again with the old configs).
    Layers and their adapter containers are kept, never parameters: FSDP2's ``fully_shard`` keeps
    the module objects (changing only their class) but replaces the parameters they hold.
    """

    configs: tuple[tuple[str, Any], ...]
    layers: tuple[Any, ...]  # every PEFT BaseTunerLayer, in module order
    containers: tuple[Any, ...]  # their ``adapter_layer_names`` dicts ({adapter: module or Parameter})
    first_path: str | None  # where ``layers[0]`` sits in the transformer (None: no layers)

    def matches(self, transformer: torch.nn.Module, configs: dict[str, Any]) -> bool:
        same_configs = len(configs) == len(self.configs) and all(
            name == known and config is known_config
            for (name, config), (known, known_config) in zip(configs.items(), self.configs)
        )
        if not same_configs or self.first_path is None:
            return same_configs
        try:
            return transformer.get_submodule(self.first_path) is self.layers[0]
        except AttributeError:
            return False


_LAYOUTS: weakref.WeakKeyDictionary[torch.nn.Module, _LoraLayout] = weakref.WeakKeyDictionary()


def _layout(transformer: torch.nn.Module, configs: dict[str, Any]) -> _LoraLayout:
    layout = _LAYOUTS.get(transformer)
    if layout is None or not layout.matches(transformer, configs):
        found = list(_tuner_layers(transformer))
        layers = tuple(layer for _, layer in found)
        containers = tuple(  # an empty one stays empty until an adapter is added, which changes peft_config
            container
            for layer in layers
            for name in layer.adapter_layer_names
            if len(container := getattr(layer, name))
        )
        layout = _LoraLayout(tuple(configs.items()), layers, containers, found[0][0] if found else None)
        _LAYOUTS[transformer] = layout
    return layout


def _tensors(item: torch.nn.Module | torch.nn.Parameter) -> Iterable[torch.Tensor | None]:
    """The parameters ``item.requires_grad_`` sets (None: an unset one, e.g. ``bias``); a module without
    submodules straight from its own dict."""
    if isinstance(item, torch.nn.Module):
        return item._parameters.values() if not item._modules else item.parameters()
    return (item,)


def activate(transformer: torch.nn.Module, active: str | None, trainable: str | None) -> None:
    """Forward with adapter ``active`` (None: the base model); only ``trainable``'s params need grad.

    Leaves each LoRA layer as PEFT's ``enable_adapters(active is not None)`` followed (for an
    adapter) by ``set_adapter(active)`` does — ``_disable_adapters``, and ``_active_adapter = [active]``
    — with ``requires_grad`` then equal to ``name == trainable`` for every adapter tensor. A training
    step switches several times per iteration, so this walks only the layers found once per set of
    adapters (see :class:`_LoraLayout`) and flips only the ``requires_grad`` flags that differ.
    """
    configs = getattr(transformer, "peft_config", {})
    if active is not None and active not in configs:
        raise ValueError(f"unknown adapter {active!r}; adapters are {list(configs)}")
    layout = _layout(transformer, configs)
    disabled = active is None
    for layer in layout.layers:
        if layer._disable_adapters != disabled:
            layer._disable_adapters = disabled
        if not disabled:  # a list of its own per layer, as PEFT's set_adapter makes: compiled blocks
            layer._active_adapter = [active]  # guard on whether layers share that list
    for container in layout.containers:
        for name, item in container.items():
            wanted = name == trainable
            for tensor in _tensors(item):
                if tensor is not None and tensor.requires_grad is not wanted:
                    tensor.requires_grad_(wanted)


@torch.no_grad()
def blend_adapter(transformer: torch.nn.Module, src: str, dst: str, decay: float) -> None:
    """``dst ← decay·dst + (1 − decay)·src`` for every LoRA tensor (decay 0 copies)."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got {decay}")
    source, target = adapter_parameters(transformer, src), adapter_parameters(transformer, dst)
    if source.keys() != target.keys():
        raise ValueError(f"adapters {src!r} and {dst!r} wrap different modules")
    torch._foreach_lerp_(list(target.values()), list(source.values()), 1.0 - decay)


def trainable_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _normalise_key(key: str, source: Path) -> str:
    for prefix in _KEY_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    if ".lora_" not in key:
        raise ValueError(f"{source}: key {key!r} is not a LoRA tensor (expected '.lora_A.' / '.lora_B.')")
    return key


def _weights_file(path: Path) -> Path:
    if path.is_dir():
        for name in WEIGHT_FILES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"{path}: no LoRA weights (looked for {', '.join(WEIGHT_FILES)})")
    if path.suffix != ".safetensors" or not path.is_file():
        raise FileNotFoundError(f"{path}: expected a LoRA .safetensors file or a folder holding one")
    return path


def _recorded_hyperparameters(weights: Path, metadata: dict[str, str] | None) -> dict[str, Any] | None:
    """``r``/``lora_alpha``/``use_rslora`` recorded beside the weights, if any."""
    config_file = weights.parent / "adapter_config.json"
    if config_file.is_file():
        try:
            return json.loads(config_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{config_file}: not valid JSON ({exc})") from exc
    if metadata and FOLDING_KEY in metadata:
        return json.loads(metadata[FOLDING_KEY])["trained"]
    if metadata and _METADATA_KEY in metadata:
        packed = json.loads(metadata[_METADATA_KEY])
        return {k.removeprefix("transformer."): v for k, v in packed.items()}
    return None


def _check_hyperparameters(source: Path, recorded: dict[str, Any] | None, lora: Any) -> None:
    if recorded is None:  # stock diffusers then uses lora_alpha = r and no rsLoRA
        recorded = {"lora_alpha": lora.r, "use_rslora": False}
        where = f"{source} records no LoRA config, so diffusers loads it with"
    else:
        where = f"{source} was trained with"
    for key, configured in (("r", lora.r), ("lora_alpha", lora.lora_alpha), ("use_rslora", lora.use_rslora)):
        if key in recorded and float(recorded[key]) != float(configured):
            raise ValueError(f"{where} {key} = {recorded[key]}, but [policy.lora] {key} = {configured}")


def load_adapter_weights(transformer: torch.nn.Module, path: str | Path, names: Iterable[str], lora: Any) -> None:
    """Copy an existing LoRA into each adapter of ``names`` (all modules must match exactly)."""
    from safetensors import safe_open

    weights = _weights_file(Path(path))
    with safe_open(str(weights), framework="pt") as handle:
        metadata = handle.metadata()
        state = {_normalise_key(k, weights): handle.get_tensor(k) for k in handle.keys()}
    _check_hyperparameters(weights, _recorded_hyperparameters(weights, metadata), lora)
    if metadata and FOLDING_KEY in metadata:
        state = unfold_scales(state, json.loads(metadata[FOLDING_KEY])["scales"], weights)
    for name in names:
        params = adapter_parameters(transformer, name)
        missing = sorted(params.keys() - state.keys())
        unexpected = sorted(state.keys() - params.keys())
        if missing or unexpected:
            raise ValueError(
                f"{weights}: LoRA modules differ from [policy.lora] target_modules; "
                f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
            )
        with torch.no_grad():
            for key, param in params.items():
                if state[key].shape != param.shape:
                    raise ValueError(f"{weights}: {key} has shape {tuple(state[key].shape)}, adapter needs "
                                     f"{tuple(param.shape)} (check [policy.lora] r)")
                param.copy_(state[key])


def adapter_export(transformer: torch.nn.Module, name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Adapter ``name`` as diffusers saves LoRAs: module keys (no prefix) on CPU, plus its PEFT config."""
    state = {k: p.detach().to("cpu", copy=True) for k, p in adapter_parameters(transformer, name).items()}
    metadata = transformer.peft_config[name].to_dict()
    return state, {k: (sorted(v) if isinstance(v, set) else v) for k, v in metadata.items()}


def adapter_scales(transformer: torch.nn.Module, name: str) -> dict[str, float]:
    """``{module: scale}`` PEFT applies to adapter ``name``'s ``lora_B @ lora_A`` in each wrapped module."""
    scales = {path: float(layer.scaling[name]) for path, layer in _tuner_layers(transformer) if name in layer.scaling}
    if not scales:
        raise KeyError(f"transformer has no LoRA adapter named {name!r}")
    return scales


def fold_scales(state: dict[str, torch.Tensor], scales: dict[str, float]) -> dict[str, torch.Tensor]:
    """``lora_B`` of every module multiplied by its scale (``lora_A`` unchanged): ``ΔW = B′·A`` at scale 1."""
    folded = {}
    for key, tensor in state.items():
        module, _, _ = key.partition(".lora_")
        if scales[module] == 0.0:
            raise ValueError(f"LoRA module {module!r} has scale 0 (lora_alpha = 0): nothing to export")
        folded[key] = tensor * scales[module] if ".lora_B." in key else tensor
    return folded


def unfold_scales(state: dict[str, torch.Tensor], scales: dict[str, float], source: Path) -> dict[str, torch.Tensor]:
    """Inverse of :func:`fold_scales` for a file that recorded its folded scales."""
    unknown = sorted({k.partition(".lora_")[0] for k in state} - scales.keys())
    if unknown:
        raise ValueError(f"{source}: {FOLDING_KEY} records no scale for {unknown[:3]}")
    return {k: v / scales[k.partition(".lora_")[0]] if ".lora_B." in k else v for k, v in state.items()}


def unit_scale_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The PEFT config of a folded adapter: ``lora_alpha = r`` per module (scale 1), no rsLoRA."""
    return {**metadata, "lora_alpha": metadata["r"], "alpha_pattern": dict(metadata.get("rank_pattern") or {}),
            "use_rslora": False}


def save_diffusers_lora(transformer: torch.nn.Module, name: str, directory: str | Path) -> Path:
    """Write ``pytorch_lora_weights.safetensors``: stock ``pipe.load_lora_weights`` loads it, and so does any
    loader that adds ``lora_B @ lora_A`` to the weight without reading metadata (scales folded into ``lora_B``)."""
    from diffusers import SanaPipeline
    from safetensors import safe_open
    from safetensors.torch import save_file

    state, metadata = adapter_export(transformer, name)
    scales = adapter_scales(transformer, name)
    SanaPipeline.save_lora_weights(directory, transformer_lora_layers=fold_scales(state, scales),
                                   transformer_lora_adapter_metadata=unit_scale_metadata(metadata))
    path = Path(directory) / WEIGHT_FILES[0]
    with safe_open(str(path), framework="pt") as handle:  # add the folding record beside diffusers' metadata
        tensors, written = {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()
    record = {"trained": {k: metadata[k] for k in _HYPERPARAMETERS if k in metadata}, "scales": scales}
    save_file(tensors, str(path), metadata={**written, FOLDING_KEY: json.dumps(record, sort_keys=True)})
    return path
