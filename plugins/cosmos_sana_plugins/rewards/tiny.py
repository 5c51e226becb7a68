"""Tiny random-initialised scorer weights, written offline in each scorer's real on-disk format.

For tests and benchmarks: real architectures (transformers CLIP and BLIP pieces,
open_clip) at toy widths, loadable through the scorers' normal ``args``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TINY_HPS_ARCH = "cosmos-sana-tiny-hps"
#: ``args.vision`` of the tiny ImageReward
BLIP_TINY = {"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "heads": 2}
_MED_TINY = {"vocab_size": 20, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "max_position_embeddings": 40, "layer_norm_eps": 1e-12,
             "hidden_act": "gelu", "pad_token_id": 0, "encoder_width": 32, "add_cross_attention": True}


def tiny_clip(folder: Path, seed: int = 0) -> Path:
    """A ``CLIPModel`` folder (32² images, width 32, logit scale e³) with tokenizer and image processor."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    folder.mkdir(parents=True, exist_ok=True)
    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["he</w>", "<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\nh e</w>\n")
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=77, eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16,
        logit_scale_init_value=3.0,
    )
    CLIPModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def preference_head_state(width: int, seed: int, prefix: str) -> dict[str, Any]:
    """Random weights of the ``width→1024→128→64→16→1`` head, keys ``{prefix}{0,2,4,6,7}.{weight,bias}``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    dims = ((width, 1024), (1024, 128), (128, 64), (64, 16), (16, 1))
    state = {}
    for index, (fan_in, fan_out) in zip((0, 2, 4, 6, 7), dims):
        state[f"{prefix}{index}.weight"] = torch.randn(fan_out, fan_in, generator=gen) / fan_in**0.5
        state[f"{prefix}{index}.bias"] = torch.randn(fan_out, generator=gen) * 0.1
    return state


def tiny_aesthetic_head(path: Path, width: int = 16, seed: int = 3) -> Path:
    """A LAION-format aesthetic head (``layers.N.*``) for CLIP embeddings of ``width``."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(preference_head_state(width, seed, "layers."), path)
    return path


def tiny_hps(folder: Path, seed: int = 1) -> tuple[str, Path]:
    """(open_clip arch, ``{"state_dict": {"module.*": …}}`` checkpoint as HPS ships it); registers the arch."""
    import open_clip
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (folder / f"{TINY_HPS_ARCH}.json").write_text(json.dumps(config))
    open_clip.add_model_config(folder / f"{TINY_HPS_ARCH}.json")
    torch.manual_seed(seed)
    model = open_clip.create_model(TINY_HPS_ARCH)
    checkpoint = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, checkpoint)
    return TINY_HPS_ARCH, checkpoint


def blip_vit_state(width: int, layers: int, patch: int, image: int, gen: Any) -> dict[str, Any]:
    """Random BLIP ViT parameters under BLIP's own (timm) names."""
    import torch

    def r(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen) * 0.2

    tokens = (image // patch) ** 2 + 1
    state = {
        "cls_token": r(1, 1, width), "pos_embed": r(1, tokens, width),
        "patch_embed.proj.weight": r(width, 3, patch, patch), "patch_embed.proj.bias": r(width),
        "norm.weight": 1 + r(width), "norm.bias": r(width),
    }
    for i in range(layers):
        b = f"blocks.{i}."
        state.update({
            b + "norm1.weight": 1 + r(width), b + "norm1.bias": r(width),
            b + "attn.qkv.weight": r(3 * width, width), b + "attn.qkv.bias": r(3 * width),
            b + "attn.proj.weight": r(width, width), b + "attn.proj.bias": r(width),
            b + "norm2.weight": 1 + r(width), b + "norm2.bias": r(width),
            b + "mlp.fc1.weight": r(4 * width, width), b + "mlp.fc1.bias": r(4 * width),
            b + "mlp.fc2.weight": r(width, 4 * width), b + "mlp.fc2.bias": r(width),
        })
    return state


def tiny_image_reward(folder: Path, seed: int = 2) -> dict[str, Any]:
    """``ImageReward.pt`` (upstream key names), ``med_config.json`` and a BERT tokenizer folder.

    Returns the paths, the raw state dict (``state``) and ``vision`` (the ``args.vision`` to pass).
    """
    import torch
    from transformers import BertTokenizerFast, BlipTextConfig
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    folder.mkdir(parents=True, exist_ok=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "cat", "dog", "red", "blue", "on", "the", "mat"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder / "tokenizer")
    (folder / "med_config.json").write_text(json.dumps(_MED_TINY))

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    text = BlipTextModel(BlipTextConfig(
        vocab_size=_MED_TINY["vocab_size"], hidden_size=_MED_TINY["hidden_size"],
        encoder_hidden_size=BLIP_TINY["width"], intermediate_size=_MED_TINY["intermediate_size"],
        num_hidden_layers=_MED_TINY["num_hidden_layers"], num_attention_heads=_MED_TINY["num_attention_heads"],
        max_position_embeddings=_MED_TINY["max_position_embeddings"],
    ), add_pooling_layer=False)
    vit = blip_vit_state(BLIP_TINY["width"], BLIP_TINY["layers"], BLIP_TINY["patch_size"], BLIP_TINY["image_size"], gen)
    state = {f"blip.visual_encoder.{k}": v for k, v in vit.items()}
    state.update({f"blip.text_encoder.{k}": v for k, v in text.state_dict().items()})
    state.update(preference_head_state(_MED_TINY["hidden_size"], seed, "mlp.layers."))
    state["blip.vision_proj.weight"] = torch.zeros(4, BLIP_TINY["width"])  # present in the real file, unused
    torch.save(state, folder / "ImageReward.pt")
    return {"checkpoint": folder / "ImageReward.pt", "med_config": folder / "med_config.json",
            "tokenizer": folder / "tokenizer", "state": state, "vision": dict(BLIP_TINY)}


def tiny_reward_args(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``[[custom.rewards]] args`` pointing each named model-based scorer at tiny weights under ``folder``
    (only what those scorers need is built; other names are left out)."""
    wanted = set(names)
    args: dict[str, dict[str, Any]] = {}
    if wanted & {"pickscore", "clipscore", "aesthetic"}:
        clip = str(tiny_clip(folder / "clip"))
        args |= {"pickscore": {"model": clip, "processor": clip}, "clipscore": {"model": clip}}
        if "aesthetic" in wanted:
            args["aesthetic"] = {"model": clip, "head": str(tiny_aesthetic_head(folder / "aesthetic.pth"))}
    if "hpsv2.1" in wanted:
        arch, hps_checkpoint = tiny_hps(folder / "hps")
        args["hpsv2.1"] = {"arch": arch, "checkpoint": str(hps_checkpoint)}
    if "imagereward" in wanted:
        image_reward = tiny_image_reward(folder / "image_reward")
        args["imagereward"] = {k: str(image_reward[k]) for k in ("checkpoint", "med_config", "tokenizer")} | {
            "vision": image_reward["vision"]
        }
    return {name: value for name, value in args.items() if name in wanted}
