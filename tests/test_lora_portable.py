"""LoRA exports any loader applies at the trained strength; the ComfyUI layout; model cards; --push-to-hub offline."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cosmos_sana.checkpoint import ModelState, save_checkpoint
from cosmos_sana.cli import main

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TARGETS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
           "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"]
# scale α/r = 1.5 everywhere except attn2.to_v (0.5): a per-module scale a loader must honour
LORA = {"r": 4, "lora_alpha": 6, "alpha_pattern": {"attn2.to_v": 2}}
RUN_CONFIG = {
    "policy": {"lora": {"r": 4, "lora_alpha": 6, "target_modules": TARGETS}},
    "train": {"max_num_steps": 9, "optm_lr": 3e-4,
              "train_policy": {"type": "grpo", "trainer_type": "sana_nft"}},
    "custom": {"rewards": [{"name": "jpeg_compressibility", "weight": 1.0}]},
    "logging": {"experiment_name": "tiny-portable"},
}

# What ComfyUI reads, written from its loader code (see cosmos_sana_plugins/sana/comfyui_lora.py):
# comfy/lora.py model_lora_keys_unet maps "lora_unet_" + <model key minus "diffusion_model." and ".weight",
# "." → "_"> onto the weight "diffusion_model.<key>.weight"; the model is ComfyUI_ExtraModels' native SanaMS,
# whose blocks hold attn.qkv / attn.proj (LiteLA) and cross_attn.q_linear / kv_linear / proj.
# comfy/weight_adapter/lora.py reads "<name>.lora_up.weight", "<name>.lora_down.weight", "<name>.alpha".
# Table: ComfyUI LoRA name → (native weight it patches, diffusers modules stacked in its rows, in order).
COMFYUI_TABLE = {
    "lora_unet_blocks_{i}_attn_qkv": ("blocks.{i}.attn.qkv.weight", ("attn1.to_q", "attn1.to_k", "attn1.to_v")),
    "lora_unet_blocks_{i}_attn_proj": ("blocks.{i}.attn.proj.weight", ("attn1.to_out.0",)),
    "lora_unet_blocks_{i}_cross_attn_q_linear": ("blocks.{i}.cross_attn.q_linear.weight", ("attn2.to_q",)),
    "lora_unet_blocks_{i}_cross_attn_kv_linear": ("blocks.{i}.cross_attn.kv_linear.weight", ("attn2.to_k", "attn2.to_v")),
    "lora_unet_blocks_{i}_cross_attn_proj": ("blocks.{i}.cross_attn.proj.weight", ("attn2.to_out.0",)),
}
COMFYUI_SUFFIXES = ("lora_up.weight", "lora_down.weight", "alpha")
TINY_LAYERS = 2


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"hidden_states": torch.randn(2, 4, 8, 8, generator=g),
            "encoder_hidden_states": torch.randn(2, 6, 32, generator=g), "timestep": torch.tensor([200.0, 800.0])}


@torch.no_grad()
def forward(transformer: torch.nn.Module) -> torch.Tensor:
    return transformer(**inputs(), return_dict=False)[0]


def base_transformer(pipeline_dir: Path) -> torch.nn.Module:
    from diffusers import SanaTransformer2DModel

    return SanaTransformer2DModel.from_pretrained(pipeline_dir, subfolder="transformer").eval()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> tuple[Path, torch.nn.Module]:
    """A LoRA checkpoint (adapter 'default', non-zero B) with its run config, and the trained transformer."""
    from peft import LoraConfig

    transformer = base_transformer(tiny_image_pipeline_dir)
    transformer.requires_grad_(False)
    transformer.add_adapter(LoraConfig(init_lora_weights="gaussian", target_modules=TARGETS, **LORA), adapter_name="default")
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    parts = {"model": ModelState(transformer, lora_only=True, base_pipeline=str(tiny_image_pipeline_dir))}
    root = tmp_path_factory.mktemp("portable_run")
    return save_checkpoint(root, 9, parts, config=RUN_CONFIG), transformer


@pytest.fixture(scope="module")
def exports(trained: tuple[Path, torch.nn.Module], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    checkpoint, _ = trained
    out = tmp_path_factory.mktemp("portable_exports")
    folders = {}
    for fmt in ("lora", "merged", "comfyui"):
        folders[fmt] = out / fmt
        assert main(["export", str(checkpoint), "--format", fmt, "--out", str(folders[fmt])]) == 0
    return folders


def merged_weights(folder: Path) -> dict[str, torch.Tensor]:
    return base_transformer(folder).state_dict()


def blind_apply(base: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], *, up: str, down: str,
                prefix: str = "") -> dict[str, torch.Tensor]:
    """A loader that reads no metadata: W += up @ down · (alpha / rank when a '.alpha' tensor is present)."""
    weights = dict(base)
    for key in lora:
        if not key.endswith(f".{up}.weight"):
            continue
        module = key.removesuffix(f".{up}.weight")
        factor = 1.0
        if f"{module}.alpha" in lora:
            factor = float(lora[f"{module}.alpha"]) / lora[f"{module}.{down}.weight"].shape[0]
        target = f"{module.removeprefix(prefix)}.weight"
        weights[target] = weights[target] + factor * lora[key] @ lora[f"{module}.{down}.weight"]
    return weights


def test_default_lora_file_without_metadata_gives_the_merged_weights(exports, tiny_image_pipeline_dir) -> None:
    from safetensors.torch import load_file

    base = base_transformer(tiny_image_pipeline_dir).state_dict()
    merged = merged_weights(exports["merged"])
    default = load_file(exports["lora"] / "pytorch_lora_weights.safetensors")
    got = blind_apply(base, default, up="lora_B", down="lora_A", prefix="transformer.")
    worst = max(float((got[k] - merged[k]).abs().max()) for k in merged)
    assert worst <= 1e-5, worst
    # control: the unscaled PEFT copy read the same blind way gives the wrong strength (what folding prevents)
    peft = load_file(exports["lora"] / "peft_adapter" / "adapter_model.safetensors")
    wrong = blind_apply(base, peft, up="lora_B", down="lora_A", prefix="base_model.model.")
    assert max(float((wrong[k] - merged[k]).abs().max()) for k in merged) > 1e-2


def test_stock_diffusers_load_of_the_default_file_equals_merged(exports, tiny_image_pipeline_dir) -> None:
    from diffusers import SanaPipeline

    pipe = SanaPipeline.from_pretrained(tiny_image_pipeline_dir)
    pipe.load_lora_weights(exports["lora"], weight_name="pytorch_lora_weights.safetensors")
    merged = base_transformer(exports["merged"])
    torch.testing.assert_close(forward(pipe.transformer), forward(merged), rtol=0, atol=1e-5)
    assert not torch.allclose(forward(merged), forward(base_transformer(tiny_image_pipeline_dir)), atol=1e-3)


def test_training_can_start_from_the_folded_file(exports, trained) -> None:
    """lora_path = the exported file: the scales are unfolded, so the adapter equals the trained one."""
    from peft import LoraConfig

    from cosmos_sana_plugins.sana.lora import adapter_parameters, load_adapter_weights

    _, source = trained
    target = type(source).from_config(source.config).eval()
    target.add_adapter(LoraConfig(target_modules=TARGETS, **LORA), adapter_name="default")
    lora = SimpleNamespace(r=4, lora_alpha=6, use_rslora=False)
    load_adapter_weights(target, exports["lora"] / "pytorch_lora_weights.safetensors", ["default"], lora)
    want = adapter_parameters(source, "default")
    for key, value in adapter_parameters(target, "default").items():
        torch.testing.assert_close(value, want[key], rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="lora_alpha = 6, but \\[policy.lora\\] lora_alpha = 8"):
        load_adapter_weights(target, exports["lora"] / "pytorch_lora_weights.safetensors", ["default"],
                             SimpleNamespace(r=4, lora_alpha=8, use_rslora=False))


def test_comfyui_file_has_the_keys_comfyui_reads_and_patches_to_merged(exports, tiny_image_pipeline_dir) -> None:
    from safetensors.torch import load_file

    from cosmos_sana_plugins.sana.native_keys import diffusers_to_native, native_to_diffusers

    lora = load_file(exports["comfyui"] / "sana_lora_comfyui.safetensors")
    expected = {f"{name.format(i=i)}.{suffix}" for name in COMFYUI_TABLE for i in range(TINY_LAYERS)
                for suffix in COMFYUI_SUFFIXES}
    assert set(lora) == expected
    # ComfyUI's key map over the native model, then its patch rule (strength 1)
    native = {f"diffusion_model.{k}": v for k, v in
              diffusers_to_native(base_transformer(tiny_image_pipeline_dir).state_dict()).items()}
    key_map = {"lora_unet_" + k.removeprefix("diffusion_model.").removesuffix(".weight").replace(".", "_"): k
               for k in native if k.endswith(".weight")}
    for name, (weight, pieces) in COMFYUI_TABLE.items():
        for i in range(TINY_LAYERS):
            assert key_map[name.format(i=i)] == f"diffusion_model.{weight.format(i=i)}"
            rows = native[key_map[name.format(i=i)]].shape[0] // len(pieces)
            assert lora[f"{name.format(i=i)}.lora_up.weight"].shape[0] == rows * len(pieces)
    patched = dict(native)
    for key in lora:
        if key.endswith(".lora_up.weight"):
            name = key.removesuffix(".lora_up.weight")
            down = lora[f"{name}.lora_down.weight"]
            scale = float(lora[f"{name}.alpha"]) / down.shape[0]
            patched[key_map[name]] = patched[key_map[name]] + scale * (lora[key] @ down)
    back = native_to_diffusers({k.removeprefix("diffusion_model."): v for k, v in patched.items()})
    merged = merged_weights(exports["merged"])
    assert back.keys() == merged.keys()
    worst = max(float((back[k] - merged[k]).abs().max()) for k in merged)
    assert worst <= 1e-5, worst


def test_comfyui_refuses_a_video_pipeline(tmp_path) -> None:
    from cosmos_sana_plugins.sana.comfyui_lora import write_comfyui_lora

    with pytest.raises(ValueError, match="SanaVideoPipeline"):
        write_comfyui_lora(torch.nn.Linear(1, 1), "default", tmp_path, pipeline_class="SanaVideoPipeline")


def test_every_export_has_a_model_card_naming_base_and_steps(exports, tiny_image_pipeline_dir) -> None:
    from huggingface_hub import ModelCard

    for fmt, folder in exports.items():
        card = ModelCard.load(folder / "README.md")
        assert card.data.library_name == "diffusers", fmt
        text = card.text
        assert str(tiny_image_pipeline_dir.resolve()) in text and "**Training steps**: 9" in text, fmt
        assert "sana_nft" in text and "jpeg_compressibility (weight 1.0)" in text, fmt
        assert "| LoRA alpha | `6` |" in text, fmt
        assert "README.md" in json.loads((folder / "export_manifest.json").read_text())["files"]
    lora_card = (exports["lora"] / "README.md").read_text()
    assert 'load_lora_weights(EXPORT, weight_name="pytorch_lora_weights.safetensors")' in lora_card
    assert "LoraLoaderModelOnly" in (exports["comfyui"] / "README.md").read_text()


def test_push_to_hub_offline_fails_clearly_before_exporting(trained, tmp_path, capsys, monkeypatch) -> None:
    checkpoint, _ = trained
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "pushed"
    assert main(["export", str(checkpoint), "--out", str(out), "--push-to-hub", "someone/tiny-sana-lora"]) == 1
    err = capsys.readouterr().err
    assert "--push-to-hub someone/tiny-sana-lora: HF_HUB_OFFLINE is set" in err and "nothing exported" in err
    assert not out.exists()
    assert main(["export", str(checkpoint), "--out", str(out), "--push-to-hub", "not a repo"]) == 1
    assert "not a Hub repo id" in capsys.readouterr().err


def test_export_defaults_to_a_folder_beside_the_run(trained, capsys) -> None:
    checkpoint, _ = trained
    assert main(["export", str(checkpoint), "--format", "lora"]) == 0
    expected = checkpoint.parent.parent / "exports" / "iter_000000009-lora"
    assert (expected / "pytorch_lora_weights.safetensors").is_file()
    assert f"exported to {expected.resolve()}" in capsys.readouterr().out


def test_rank_pattern_and_rslora_scales_fold_too(tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    """rsLoRA (α/√r) and a per-module rank: stock diffusers and a blind loader both get the trained output."""
    from diffusers import SanaPipeline
    from peft import LoraConfig
    from safetensors.torch import load_file

    from cosmos_sana_plugins.sana.lora import save_diffusers_lora

    transformer = base_transformer(tiny_image_pipeline_dir)
    config = LoraConfig(r=4, lora_alpha=6, use_rslora=True, rank_pattern={"attn1.to_k": 2},
                        init_lora_weights="gaussian", target_modules=TARGETS)
    transformer.add_adapter(config, adapter_name="default")
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    expected = forward(transformer)
    path = save_diffusers_lora(transformer, "default", tmp_path)
    pipe = SanaPipeline.from_pretrained(tiny_image_pipeline_dir)
    pipe.load_lora_weights(tmp_path, weight_name=path.name)
    torch.testing.assert_close(forward(pipe.transformer), expected, rtol=0, atol=1e-5)
    blind = base_transformer(tiny_image_pipeline_dir)
    blind.load_state_dict(blind_apply(blind.state_dict(), load_file(path), up="lora_B", down="lora_A",
                                      prefix="transformer."))
    torch.testing.assert_close(forward(blind), expected, rtol=0, atol=1e-5)


def test_comfyui_export_refuses_verify(trained, tmp_path, capsys) -> None:
    checkpoint, _ = trained
    out = tmp_path / "comfy"
    assert main(["export", str(checkpoint), "--format", "comfyui", "--verify", "--out", str(out)]) == 1
    assert "--verify loads the export with diffusers, which does not read the comfyui layout" in capsys.readouterr().err
    assert not out.exists()


def test_model_card_names_a_hub_base_model_id(exports) -> None:
    """A run on a Hub model records its id as the card's base_model (a local folder stays out of the metadata)."""
    from huggingface_hub import ModelCard

    from cosmos_sana.export.model_card import card_text

    manifest = json.loads((exports["lora"] / "export_manifest.json").read_text())
    hub_run = {**RUN_CONFIG, "policy": {**RUN_CONFIG["policy"], "model_name_or_path": "Efficient-Large-Model/Sana_600M"}}
    assert ModelCard(card_text(manifest, hub_run)).data.base_model == "Efficient-Large-Model/Sana_600M"
    assert ModelCard((exports["lora"] / "README.md").read_text()).data.base_model is None


@pytest.mark.parametrize(("public", "private"), [(False, True), (True, False)])
def test_push_creates_a_private_repo_unless_public(tmp_path, monkeypatch, public: bool, private: bool) -> None:
    """The Hub client is replaced by a recorder (no network here); the export's manifest names local
    paths, so a new repo is private unless --public asks otherwise."""
    import huggingface_hub

    from cosmos_sana.export.hub import push_to_hub

    calls = {}

    class Recorder:
        def create_repo(self, repo, **kwargs):
            calls["create"] = (repo, kwargs)

        def upload_folder(self, **kwargs):
            calls["upload"] = kwargs
            return type("Commit", (), {"commit_url": "https://example.invalid/commit"})()

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "HfApi", Recorder)
    assert push_to_hub(tmp_path, "someone/tiny", public=public) == "https://example.invalid/commit"
    assert calls["create"] == ("someone/tiny", {"repo_type": "model", "exist_ok": True, "private": private})
    assert calls["upload"]["folder_path"] == str(tmp_path)
