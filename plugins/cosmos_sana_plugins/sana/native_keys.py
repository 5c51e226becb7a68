"""Native SANA state-dict keys ↔ diffusers ``SanaTransformer2DModel`` / ``SanaVideoTransformer3DModel`` keys.

Pure functions over ``{key: tensor}`` dicts. Native layouts covered: SANA 1.0/1.5 (``.conv`` GLUMBConv),
LinearFFN (``.linear`` 1×1 layers, Sol-RL), SANA-Sprint (``cfg_embedder``) and SANA-Video (``t_conv``).
Every conversion is strict: any key it cannot place raises :class:`NativeKeyError` listing all of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

#: Native keys that carry no diffusers weight (SANA uses no positional embedding; the null caption
#: embedding and the log-variance head are training-only).
DROPPED_KEYS = ("pos_embed", "y_embedder.y_embedding")
DROPPED_PREFIXES = ("logvar_linear.",)

IMAGE_CLASS = "SanaTransformer2DModel"
VIDEO_CLASS = "SanaVideoTransformer3DModel"


class NativeKeyError(KeyError):
    """A state dict does not map; ``keys`` lists every offending key and ``str()`` shows them."""

    def __init__(self, message: str, keys: Iterable[str] = ()) -> None:
        self.keys = sorted(keys)
        listed = "".join(f"\n  {k}" for k in self.keys)
        super().__init__(f"{message}{listed}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class _Rule:
    """A native module path → diffusers module path(s); ``kind`` says how the tensors change."""

    native: str
    diffusers: tuple[str, ...]
    kind: str = "rename"  # "rename" | "split" (chunk dim 0) | "linear" ([O,I] ↔ [O,I,1,1])


_BLOCK_RULES = (
    _Rule("attn.qkv", ("attn1.to_q", "attn1.to_k", "attn1.to_v"), "split"),
    _Rule("attn.q_norm", ("attn1.norm_q",)),
    _Rule("attn.k_norm", ("attn1.norm_k",)),
    _Rule("attn.proj", ("attn1.to_out.0",)),
    _Rule("cross_attn.q_linear", ("attn2.to_q",)),
    _Rule("cross_attn.kv_linear", ("attn2.to_k", "attn2.to_v"), "split"),
    _Rule("cross_attn.q_norm", ("attn2.norm_q",)),
    _Rule("cross_attn.k_norm", ("attn2.norm_k",)),
    _Rule("cross_attn.proj", ("attn2.to_out.0",)),
    _Rule("mlp.inverted_conv.conv", ("ff.conv_inverted",)),
    _Rule("mlp.inverted_conv.linear", ("ff.conv_inverted",), "linear"),
    _Rule("mlp.depth_conv.conv", ("ff.conv_depth",)),
    _Rule("mlp.point_conv.conv", ("ff.conv_point",)),
    _Rule("mlp.point_conv.linear", ("ff.conv_point",), "linear"),
    _Rule("mlp.t_conv", ("ff.conv_temp",)),
)
_LINEAR_FORMS = {r.native for r in _BLOCK_RULES if r.kind == "linear"}
_HAS_LINEAR_FORM = {name.replace(".linear", ".conv") for name in _LINEAR_FORMS}

_COMMON_RULES = (
    _Rule("t_block.1", ("time_embed.linear",)),
    _Rule("y_embedder.y_proj.fc1", ("caption_projection.linear_1",)),
    _Rule("y_embedder.y_proj.fc2", ("caption_projection.linear_2",)),
    _Rule("attention_y_norm", ("caption_norm",)),
    _Rule("final_layer.linear", ("proj_out",)),
)

# Bare parameters (no ``.weight``/``.bias`` suffix).
_GLOBAL_PARAMS = {"final_layer.scale_shift_table": "scale_shift_table"}
_BLOCK_PARAMS = {"scale_shift_table"}

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_DIFFUSERS_BLOCK = re.compile(r"^transformer_blocks\.(\d+)\.(.+)$")
_LORA = re.compile(r"^(?P<module>.+?)\.(?P<which>lora_[AB])(?P<adapter>\.[^.]+)?\.(?P<param>weight|bias)$")


def _global_rules(*, video: bool, guidance: bool) -> tuple[_Rule, ...]:
    """Rules outside the blocks; Sprint's guidance model keeps its timestep MLP outside ``time_embed.emb``."""
    time = "time_embed.timestep_embedder" if guidance else "time_embed.emb.timestep_embedder"
    rules = [
        _Rule("x_embedder.proj", ("patch_embedding",) if video else ("patch_embed.proj",)),
        _Rule("t_embedder.mlp.0", (f"{time}.linear_1",)),
        _Rule("t_embedder.mlp.2", (f"{time}.linear_2",)),
        *_COMMON_RULES,
    ]
    if guidance:
        rules += [
            _Rule("cfg_embedder.mlp.0", ("time_embed.guidance_embedder.linear_1",)),
            _Rule("cfg_embedder.mlp.2", ("time_embed.guidance_embedder.linear_2",)),
        ]
    return tuple(rules)


# --------------------------------------------------------------------------- layout detection


def is_video_native(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """SANA-Video checkpoints embed patches with a Conv3d (5-D ``x_embedder.proj.weight``)."""
    weight = state_dict.get("x_embedder.proj.weight")
    if weight is None:
        raise NativeKeyError("not a native SANA state dict: no 'x_embedder.proj.weight'", ["x_embedder.proj.weight"])
    return weight.ndim == 5


def has_guidance_embedder(state_dict: Mapping[str, Any]) -> bool:
    """SANA-Sprint checkpoints carry a CFG-scale embedder (``cfg_embedder.*``)."""
    return any(k.startswith("cfg_embedder.") for k in state_dict)


def has_linear_ffn(state_dict: Mapping[str, Any]) -> bool:
    """LinearFFN (Sol-RL) checkpoints store the FFN's 1×1 layers as ``.linear`` ``[O, I]`` weights."""
    return any((block := _BLOCK.match(k)) and block.group(2).rsplit(".", 1)[0] in _LINEAR_FORMS for k in state_dict)


def _dropped(key: str) -> bool:
    return key in DROPPED_KEYS or key.startswith(DROPPED_PREFIXES)


# --------------------------------------------------------------------------- native → diffusers


def native_to_diffusers(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers-layout copy of a native SANA transformer state dict (:data:`DROPPED_KEYS` are left out).

    Split pieces are cloned so no two diffusers tensors share storage (safetensors refuses that).
    """
    video, guidance = is_video_native(state_dict), has_guidance_embedder(state_dict)
    global_rules = {r.native: r for r in _global_rules(video=video, guidance=guidance)}
    block_rules = {r.native: r for r in _BLOCK_RULES}
    out: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    for key, tensor in state_dict.items():
        if _dropped(key):
            continue
        if key in _GLOBAL_PARAMS:
            out[_GLOBAL_PARAMS[key]] = tensor
            continue
        prefix, path, rules = "", key, global_rules
        if block := _BLOCK.match(key):
            prefix, path, rules = f"transformer_blocks.{block[1]}.", block[2], block_rules
            if path in _BLOCK_PARAMS:
                out[prefix + path] = tensor
                continue
        module, _, param = path.rpartition(".")
        rule = rules.get(module)
        if rule is None:
            unmapped.append(key)
            continue
        for target, piece in zip(rule.diffusers, _to_diffusers_tensors(rule, tensor)):
            out[f"{prefix}{target}.{param}"] = piece
    if unmapped:
        raise NativeKeyError(f"{len(unmapped)} native key(s) have no diffusers equivalent:", unmapped)
    return out


def _to_diffusers_tensors(rule: _Rule, tensor: torch.Tensor) -> list[torch.Tensor]:
    if rule.kind == "split":
        return [piece.clone() for piece in tensor.chunk(len(rule.diffusers), dim=0)]
    if rule.kind == "linear" and tensor.ndim == 2:
        return [tensor.reshape(*tensor.shape, 1, 1)]
    return [tensor]


# --------------------------------------------------------------------------- diffusers → native


def diffusers_to_native(state_dict: Mapping[str, torch.Tensor], *, linear_ffn: bool = False) -> dict[str, torch.Tensor]:
    """Native-layout copy of a diffusers SANA transformer state dict.

    ``linear_ffn=True`` writes the 1×1 FFN layers as ``.linear`` ``[O, I]`` (LinearFFN / Sol-RL checkpoints)
    instead of ``.conv`` ``[O, I, 1, 1]``.
    """
    video = "patch_embedding.weight" in state_dict
    guidance = any(k.startswith("time_embed.guidance_embedder.") for k in state_dict)
    global_lookup = _reverse(_global_rules(video=video, guidance=guidance), linear_ffn)
    block_lookup = _reverse(_BLOCK_RULES, linear_ffn)
    reverse_params = {v: k for k, v in _GLOBAL_PARAMS.items()}
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[int, torch.Tensor]] = {}
    unmapped: list[str] = []
    for key, tensor in state_dict.items():
        if key in reverse_params:
            out[reverse_params[key]] = tensor
            continue
        prefix, path, lookup = "", key, global_lookup
        if block := _DIFFUSERS_BLOCK.match(key):
            prefix, path, lookup = f"blocks.{block[1]}.", block[2], block_lookup
            if path in _BLOCK_PARAMS:
                out[prefix + path] = tensor
                continue
        module, _, param = path.rpartition(".")
        found = lookup.get(module)
        if found is None:
            unmapped.append(key)
            continue
        rule, index = found
        native_key = f"{prefix}{rule.native}.{param}"
        if rule.kind == "split":
            parts.setdefault(native_key, {})[index] = tensor
        elif rule.kind == "linear" and tensor.ndim == 4:
            out[native_key] = tensor.reshape(tensor.shape[0], tensor.shape[1])
        else:
            out[native_key] = tensor
    for native_key, pieces in parts.items():
        arity = 3 if ".attn.qkv." in native_key else 2
        if sorted(pieces) != list(range(arity)):
            unmapped.append(native_key)
            continue
        out[native_key] = torch.cat([pieces[i] for i in range(arity)], dim=0)
    if unmapped:
        raise NativeKeyError(
            "diffusers keys without a native equivalent, or fused native tensors missing a piece:", unmapped
        )
    return out


def _reverse(rules: Iterable[_Rule], linear_ffn: bool) -> dict[str, tuple[_Rule, int]]:
    """diffusers module → (native rule, piece index), picking the ``.linear`` or ``.conv`` FFN form."""
    lookup: dict[str, tuple[_Rule, int]] = {}
    for rule in rules:
        if rule.native in (_HAS_LINEAR_FORM if linear_ffn else _LINEAR_FORMS):
            continue  # the other storage form of a 1×1 FFN layer
        for index, target in enumerate(rule.diffusers):
            lookup[target] = (rule, index)
    return lookup


def native_module(module: str, *, video: bool = False, guidance: bool = False) -> tuple[str, int, int]:
    """A diffusers module path → (native module path, this piece's index in the fused native weight, piece count).

    ``transformer_blocks.3.attn1.to_k`` → ``("blocks.3.attn.qkv", 1, 3)``; an unfused module gives ``(path, 0, 1)``.
    1×1 FFN layers map to their ``.conv`` form.
    """
    prefix, path, lookup = "", module, _reverse(_global_rules(video=video, guidance=guidance), False)
    if block := _DIFFUSERS_BLOCK.match(module):
        prefix, path, lookup = f"blocks.{block[1]}.", block[2], _reverse(_BLOCK_RULES, False)
    found = lookup.get(path)
    if found is None:
        raise NativeKeyError("diffusers module without a native SANA equivalent:", [module])
    rule, index = found
    return prefix + rule.native, index, len(rule.diffusers)


# --------------------------------------------------------------------------- LoRA (native → diffusers)


def native_lora_to_diffusers(state_dict: Mapping[str, torch.Tensor], *, prefix: str = "") -> dict[str, torch.Tensor]:
    """PEFT LoRA tensors on native block modules → the same adapter on diffusers modules.

    A LoRA on a fused native target (``attn.qkv``, ``cross_attn.kv_linear``) becomes one LoRA per split
    target sharing ``lora_A``, with ``lora_B`` rows chunked: ΔW = B·A is preserved exactly. LinearFFN
    LoRA matrices become 1×1 conv kernels. Keys may carry ``base_model.model.`` and a PEFT adapter name
    (``lora_A.default.weight``); results are ``prefix`` + diffusers module + ``.lora_A.weight``.
    """
    block_rules = {r.native: r for r in _BLOCK_RULES}
    out: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    for key, tensor in state_dict.items():
        match = _LORA.match(key.removeprefix("base_model.model."))
        block = _BLOCK.match(match["module"]) if match else None
        rule = block_rules.get(block[2]) if block else None
        if rule is None:
            unmapped.append(key)
            continue
        if match["which"] == "lora_B" and rule.kind == "split":
            pieces = [p.clone() for p in tensor.chunk(len(rule.diffusers), dim=0)]
        else:
            pieces = [tensor] * len(rule.diffusers)
        if rule.kind == "linear" and match["param"] == "weight" and tensor.ndim == 2:
            pieces = [p.reshape(*p.shape, 1, 1) for p in pieces]
        for target, piece in zip(rule.diffusers, pieces):
            out[f"{prefix}transformer_blocks.{block[1]}.{target}.{match['which']}.{match['param']}"] = piece
    if unmapped:
        raise NativeKeyError("LoRA keys that are not on a mappable native SANA block module:", unmapped)
    return out


# --------------------------------------------------------------------------- architecture inference

#: Attention geometry by (video, hidden size): self heads × head dim, cross heads × head dim.
_KNOWN_WIDTHS: dict[tuple[bool, int], dict[str, int]] = {
    (False, 1152): {"num_attention_heads": 36, "attention_head_dim": 32,
                    "num_cross_attention_heads": 16, "cross_attention_head_dim": 72},
    (False, 2240): {"num_attention_heads": 70, "attention_head_dim": 32,
                    "num_cross_attention_heads": 20, "cross_attention_head_dim": 112},
    (True, 2240): {"num_attention_heads": 20, "attention_head_dim": 112,
                   "num_cross_attention_heads": 20, "cross_attention_head_dim": 112},
}
_NAMES = {(False, 1152, 28): "SANA 600M", (False, 2240, 20): "SANA 1600M", (False, 2240, 60): "SANA 4.8B",
          (True, 2240, 20): "SANA-Video 2B"}


def architecture_name(state_dict: Mapping[str, torch.Tensor]) -> str:
    """``"SANA 1600M"`` etc. for published shapes, else a description of the shapes."""
    video = is_video_native(state_dict)
    hidden, layers = state_dict["x_embedder.proj.weight"].shape[0], _num_layers(state_dict)
    kind = "SANA-Video" if video else "SANA"
    return _NAMES.get((video, hidden, layers), f"unknown {kind} (hidden {hidden}, {layers} layers)")


def infer_transformer_config(state_dict: Mapping[str, torch.Tensor]) -> tuple[str, dict[str, Any]]:
    """(diffusers class name, constructor kwargs) for a native state dict of a known SANA width.

    Head counts are not recoverable from weights, so widths outside the known table raise
    :class:`NativeKeyError`: pass the diffusers transformer config instead. ``sample_size`` is the
    published default (32 → 1024² images, 30 → 480p video).
    """
    video = is_video_native(state_dict)
    patch_weight = state_dict["x_embedder.proj.weight"]
    hidden = patch_weight.shape[0]
    heads = _KNOWN_WIDTHS.get((video, hidden))
    if heads is None:
        known = ", ".join(f"{'video' if v else 'image'} {w}" for v, w in _KNOWN_WIDTHS)
        raise NativeKeyError(
            f"cannot infer attention heads for {architecture_name(state_dict)} (known widths: {known}); "
            "pass the diffusers transformer config (base_config / --base)",
            ["x_embedder.proj.weight"],
        )
    patch = tuple(patch_weight.shape[2:])
    inverted = _first(state_dict, "blocks.0.mlp.inverted_conv.conv.weight", "blocks.0.mlp.inverted_conv.linear.weight")
    config: dict[str, Any] = {
        **heads,
        "in_channels": patch_weight.shape[1],
        "out_channels": state_dict["final_layer.linear.weight"].shape[0] // math.prod(patch),
        "num_layers": _num_layers(state_dict),
        "cross_attention_dim": state_dict["blocks.0.cross_attn.kv_linear.weight"].shape[1],
        "caption_channels": state_dict["y_embedder.y_proj.fc1.weight"].shape[1],
        "mlp_ratio": inverted.shape[0] / 2 / hidden,
        "attention_bias": "blocks.0.attn.qkv.bias" in state_dict,
        "patch_size": list(patch) if video else patch[0],
        "sample_size": 30 if video else 32,
        "norm_elementwise_affine": False,
        "norm_eps": 1e-6,
        "qk_norm": "rms_norm_across_heads" if "blocks.0.attn.q_norm.weight" in state_dict else None,
        "guidance_embeds": has_guidance_embedder(state_dict),
    }
    return (VIDEO_CLASS if video else IMAGE_CLASS), config


def _num_layers(state_dict: Mapping[str, Any]) -> int:
    indices = {int(m[1]) for k in state_dict if (m := _BLOCK.match(k))}
    if not indices:
        raise NativeKeyError("native SANA state dict has no 'blocks.N.*' keys")
    return max(indices) + 1


def _first(state_dict: Mapping[str, torch.Tensor], *keys: str) -> torch.Tensor:
    for key in keys:
        if key in state_dict:
            return state_dict[key]
    raise NativeKeyError("native SANA state dict lacks every one of:", keys)
