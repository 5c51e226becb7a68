"""convert-to-dcp and export round trips on tiny random SANA pipelines (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosmos_sana.checkpoint import CheckpointError, ModelState, ParameterEMA, save_checkpoint
from cosmos_sana.cli import main

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def image_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(2, 6, 32, generator=g),
        "timestep": torch.tensor([250.0, 750.0]),
    }


@torch.no_grad()
def forward(transformer: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return transformer(**inputs, return_dict=False)[0]


def base_transformer(pipeline_dir: Path) -> torch.nn.Module:
    from diffusers import SanaTransformer2DModel

    return SanaTransformer2DModel.from_pretrained(pipeline_dir, subfolder="transformer").eval()


def lora_transformer(pipeline_dir: Path) -> torch.nn.Module:
    """Base weights + adapters 'default' (trained) and 'old', with non-zero B so they change outputs."""
    from peft import LoraConfig

    transformer = base_transformer(pipeline_dir)
    config = LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian", target_modules=TARGETS)
    transformer.requires_grad_(False)
    transformer.add_adapter(config, adapter_name="default")
    transformer.add_adapter(config, adapter_name="old")
    transformer.set_adapter("default")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
                p.requires_grad_(".default." in name)
    return transformer


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("converted") / "dcp"
    assert main(["convert-to-dcp", str(tiny_image_pipeline_dir), "--out", str(out), "--chunk-size", "50KB"]) == 0
    return out


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> tuple[Path, torch.nn.Module]:
    transformer = lora_transformer(tiny_image_pipeline_dir)
    parts = {"model": ModelState(transformer, lora_only=True, base_pipeline=str(tiny_image_pipeline_dir))}
    root = tmp_path_factory.mktemp("lora_run")
    return save_checkpoint(root, 7, parts, config={"policy": {"lora": {"r": 4}}}), transformer


def test_convert_writes_chunked_dcp_with_config(converted: Path, tiny_image_pipeline_dir: Path) -> None:
    from cosmos_sana.checkpoint.dcp_io import stored_keys

    data_files = sorted((converted / "model").glob("*.distcp"))
    assert len(data_files) >= 3  # 50 KB chunks of a ~220 KB transformer
    config = json.loads((converted / "config.json").read_text())
    assert config["_class_name"] == "SanaTransformer2DModel"
    assert stored_keys(converted / "model") == set(base_transformer(tiny_image_pipeline_dir).state_dict())
    meta = json.loads((converted / "meta.json").read_text())
    assert meta["kind"] == "converted" and meta["step"] == 0
    assert (converted / "COMPLETE").is_file()


def test_training_starts_from_converted_dcp(converted: Path, tiny_image_pipeline_dir: Path) -> None:
    from cosmos_sana.checkpoint import load_model_weights
    from cosmos_sana.tools.tiny import build_transformer
    from cosmos_sana.tools.tiny_presets import PRESETS

    reference = lora_transformer(tiny_image_pipeline_dir)
    torch.manual_seed(42)
    fresh = build_transformer(PRESETS["tiny"])  # random, then LoRA injected before loading the base
    fresh.add_adapter(reference.peft_config["default"], adapter_name="default")
    load_model_weights(converted, fresh)
    expected = base_transformer(tiny_image_pipeline_dir).state_dict()
    got = {k.replace(".base_layer", ""): v for k, v in fresh.state_dict().items() if "lora_" not in k}
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_full_export_loads_in_stock_diffusers_and_matches(converted: Path, tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    from diffusers import SanaPipeline

    out = tmp_path / "export"
    out.mkdir()
    (out / "export_manifest.json").write_text("{}")  # a previous export: replaced
    (out / "stale.bin").write_bytes(b"x")
    assert main(["export", str(converted), "--out", str(out), "--max-shard-size", "100KB"]) == 0
    assert not (out / "stale.bin").exists()
    assert (out / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert len(list((out / "transformer").glob("*.safetensors"))) >= 2
    pipe = SanaPipeline.from_pretrained(out)
    inputs = image_inputs()
    assert torch.equal(forward(pipe.transformer, inputs), forward(base_transformer(tiny_image_pipeline_dir), inputs))
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert manifest["format"] == "diffusers" and manifest["step"] == 0
    assert manifest["source_checkpoint"] == str(converted.resolve())
    assert {"torch", "diffusers", "peft"} <= set(manifest["versions"]) and len(manifest["config_sha256"]) == 64
    assert "tokenizer/tokenizer.json" in manifest["files"]
    assert (out / "COMPLETE").is_file()
    components = {"scheduler", "text_encoder", "tokenizer", "vae"}
    assert {p.name for p in out.iterdir()} == components | {"transformer", "model_index.json", "export_manifest.json", "COMPLETE",
                                                    "README.md"}
    for path in tiny_image_pipeline_dir.rglob("*"):  # every other component: the base's bytes
        relative = path.relative_to(tiny_image_pipeline_dir)
        if path.is_file() and (relative.parts[0] in components or relative.name == "model_index.json"):
            assert (out / relative).read_bytes() == path.read_bytes(), relative


def test_full_export_copies_only_the_components_model_index_names(
    converted: Path, tiny_image_pipeline_dir: Path, tmp_path: Path
) -> None:
    """The base may be an earlier export with more exports inside it, and a component may carry a pickle
    copy of its weights: only the components' safetensors-era files travel, never markers or manifests."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_image_pipeline_dir, base)
    assert main(["export", str(converted), "--out", str(tmp_path / "first"), "--base", str(base)]) == 0
    shutil.move(tmp_path / "first", base / "exports" / "first")  # an earlier export kept inside the base
    (base / "export_manifest.json").write_text("{}")
    (base / "COMPLETE").write_text("{}")
    (base / "text_encoder" / "pytorch_model.bin").write_bytes(b"pickle")
    out = tmp_path / "second"
    assert main(["export", str(converted), "--out", str(out), "--base", str(base)]) == 0
    assert not (out / "exports").exists() and not (out / "text_encoder" / "pytorch_model.bin").exists()
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert "COMPLETE" not in manifest["files"] and "export_manifest.json" not in manifest["files"]
    assert (out / "text_encoder" / "config.json").read_bytes() == (base / "text_encoder" / "config.json").read_bytes()


@pytest.mark.parametrize(
    ("safetensors", "pickle_copied"),
    [("model.safetensors", False), ("model-00001-of-00002.safetensors", False), ("model.fp16.safetensors", True)],
)
def test_component_copy_leaves_out_pickles_only_beside_default_safetensors(
    tmp_path: Path, safetensors: str, pickle_copied: bool
) -> None:
    """diffusers/transformers load ``model.safetensors`` (or its shards) first and fall back to
    ``pytorch_model.bin``, never to a variant; so a folder whose only safetensors is a variant keeps its pickle."""
    from cosmos_sana.export.writers import copy_component

    src, dst = tmp_path / "text_encoder", tmp_path / "out"
    files = {safetensors: b"st", "pytorch_model.bin": b"pickle", "pytorch_model.bin.index.json": b"{}",
             "config.json": b"{}", "sub/spiece.model": b"sp"}
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    copy_component(src, dst)
    copied = {p.relative_to(dst).as_posix(): p.read_bytes() for p in dst.rglob("*") if p.is_file()}
    kept = {k: v for k, v in files.items() if pickle_copied or not k.startswith("pytorch_model.bin")}
    assert copied == kept


def test_full_export_refuses_a_missing_component(converted: Path, tiny_image_pipeline_dir: Path, tmp_path: Path, capsys) -> None:
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_image_pipeline_dir, base)
    shutil.rmtree(base / "vae")
    assert main(["export", str(converted), "--out", str(tmp_path / "out"), "--base", str(base)]) != 0
    assert "vae: component folder named in" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_of_a_checkpoint_missing_a_weight_fails(converted: Path, tmp_path: Path, capsys) -> None:
    """The transformer is built without initialisation: a weight the checkpoint lacks must be an error."""
    import shutil

    from torch.distributed.checkpoint import FileSystemReader

    from cosmos_sana.checkpoint.dcp_io import load_state, save_state

    broken = tmp_path / "broken"
    shutil.copytree(converted, broken)
    model = broken / "model"
    stored = FileSystemReader(str(model)).read_metadata().state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in stored.items()}
    load_state(state, model)
    del state["caption_norm.weight"]
    shutil.rmtree(model)
    save_state(state, model)
    assert main(["export", str(broken), "--out", str(tmp_path / "out")]) != 0
    assert "caption_norm.weight" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_refuses_to_delete_foreign_folder(converted: Path, tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["export", str(converted), "--out", str(out)]) == 1
    assert (out / "notes.txt").read_text() == "keep me"


def test_lora_export_loads_with_load_lora_weights(
    lora_checkpoint, tiny_image_pipeline_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import SanaPipeline
    from peft import PeftModel
    from safetensors import safe_open

    path, trained = lora_checkpoint
    out = tmp_path / "lora"
    assert main(["export", str(path), "--out", str(out), "--verify", "--verify-size", "64"]) == 0  # auto → lora
    with safe_open(str(out / "pytorch_lora_weights.safetensors"), framework="pt") as handle:
        keys = list(handle.keys())
    assert keys and all(k.startswith("transformer.") and ".lora_" in k for k in keys)
    assert not any(".old." in k or ".default." in k for k in keys)

    inputs = image_inputs()
    trained.set_adapter("default")
    expected = forward(trained, inputs)
    pipe = SanaPipeline.from_pretrained(tiny_image_pipeline_dir)
    base_out = forward(pipe.transformer, inputs)
    # the plain folder form users call online (offline, diffusers insists on weight_name=)
    monkeypatch.setattr("diffusers.loaders.lora_base.HF_HUB_OFFLINE", False)
    pipe.load_lora_weights(out)
    loaded = forward(pipe.transformer, inputs)
    assert not torch.allclose(loaded, base_out, atol=1e-4)  # the LoRA really loaded
    assert torch.equal(loaded, expected)

    peft_model = PeftModel.from_pretrained(base_transformer(tiny_image_pipeline_dir), out / "peft_adapter")
    # PEFT's own loader rebuilds the layers itself: equal up to fp32 rounding
    torch.testing.assert_close(forward(peft_model.base_model.model, inputs), expected, rtol=0, atol=1e-6)
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert manifest["adapter"] == "default" and manifest["step"] == 7


def test_merged_and_old_adapter_exports(lora_checkpoint, tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    from diffusers import SanaPipeline

    path, trained = lora_checkpoint
    inputs = image_inputs()
    trained.set_adapter("default")
    unmerged = forward(trained, inputs)
    out = tmp_path / "merged"
    assert main(["export", str(path), "--out", str(out), "--format", "merged"]) == 0
    merged = SanaPipeline.from_pretrained(out).transformer
    assert not any("lora" in k for k in merged.state_dict())
    torch.testing.assert_close(forward(merged, inputs), unmerged, rtol=0, atol=1e-5)  # fp32: W + s·BA folded in

    out_bf16 = tmp_path / "merged_bf16"
    assert main(["export", str(path), "--out", str(out_bf16), "--format", "merged", "--dtype", "bfloat16"]) == 0
    merged_bf16 = SanaPipeline.from_pretrained(out_bf16, torch_dtype=torch.bfloat16).transformer.state_dict()
    for key, value in merged.state_dict().items():  # merged at fp32, then rounded once to bf16
        assert torch.equal(merged_bf16[key], value.to(torch.bfloat16)), key

    old = tmp_path / "old"
    assert main(["export", str(path), "--out", str(old), "--adapter", "old"]) == 0
    pipe = SanaPipeline.from_pretrained(tiny_image_pipeline_dir)
    pipe.load_lora_weights(old, weight_name="pytorch_lora_weights.safetensors")
    trained.set_adapter("old")
    try:
        assert torch.equal(forward(pipe.transformer, inputs), forward(trained, inputs))
    finally:
        trained.set_adapter("default")


def test_native_export_maps_back(converted: Path, tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    from cosmos_sana.checkpoint.dcp_io import load_state
    from cosmos_sana_plugins.sana.native_checkpoint import load_native_transformer

    out = tmp_path / "native"
    assert main(["export", str(converted), "--out", str(out), "--format", "native"]) == 0
    back = load_native_transformer(str(out / "sana_native.pth"), base_config=str(tiny_image_pipeline_dir))
    expected = base_transformer(tiny_image_pipeline_dir).state_dict()
    got = back.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)

    # and the native file converts back to DCP (with --base for config, VAE and text encoder)
    dcp_dir = tmp_path / "from_native"
    native = str(out / "sana_native.pth")
    assert main(["convert-to-dcp", native, "--base", str(tiny_image_pipeline_dir), "--out", str(dcp_dir)]) == 0
    state = {k: torch.empty_like(v) for k, v in expected.items()}
    load_state(state, dcp_dir / "model")
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert json.loads((dcp_dir / "meta.json").read_text())["parts"]["model"]["base_pipeline"] == str(
        tiny_image_pipeline_dir.resolve()
    )


def test_ema_export_swaps_in_averaged_weights(tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    from diffusers import SanaPipeline

    transformer = base_transformer(tiny_image_pipeline_dir)
    ema = ParameterEMA(transformer, decay=0.5)
    with torch.no_grad():
        for p in transformer.parameters():
            p.add_(1.0)
    ema.update()
    parts = {"model": ModelState(transformer, base_pipeline=str(tiny_image_pipeline_dir)), "ema": ema}
    path = save_checkpoint(tmp_path / "run", 3, parts)
    out = tmp_path / "ema_export"
    assert main(["export", str(tmp_path / "run"), "--out", str(out), "--ema"]) == 0  # run dir → latest
    exported = dict(SanaPipeline.from_pretrained(out).transformer.named_parameters())
    assert all(torch.equal(exported[k], v) for k, v in ema.state_dict().items())
    assert not torch.equal(exported["proj_out.weight"], transformer.proj_out.weight)
    assert json.loads((out / "export_manifest.json").read_text())["ema"] is True

    no_ema = save_checkpoint(tmp_path / "plain", 1, {"model": parts["model"]})
    with pytest.raises(CheckpointError, match="no 'ema' part"):
        from cosmos_sana.export import export_checkpoint

        export_checkpoint(no_ema, tmp_path / "x", ema=True)
    assert path.name == "iter_000000003"


def test_video_convert_export_verify(tiny_video_pipeline_dir: Path, tmp_path: Path) -> None:
    from diffusers import SanaVideoPipeline, SanaVideoTransformer3DModel

    dcp_dir, out = tmp_path / "dcp", tmp_path / "video_export"
    assert main(["convert-to-dcp", str(tiny_video_pipeline_dir), "--out", str(dcp_dir)]) == 0
    assert main(["export", str(dcp_dir), "--out", str(out), "--verify", "--verify-size", "64", "--verify-frames", "5"]) == 0
    loaded = SanaVideoPipeline.from_pretrained(out).transformer
    original = SanaVideoTransformer3DModel.from_pretrained(tiny_video_pipeline_dir, subfolder="transformer")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), original.state_dict().values()))
    assert json.loads((out / "export_manifest.json").read_text())["verified"]["shape"] == [1, 5, 3, 64, 64]


def test_restore_skips_random_init_but_keeps_computed_buffers(
    tiny_image_pipeline_dir: Path, tiny_video_pipeline_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import SanaTransformer2DModel, SanaVideoTransformer3DModel

    from cosmos_sana.export.restore import _uninitialised

    video_config = SanaVideoTransformer3DModel.load_config(tiny_video_pipeline_dir / "transformer")
    video = _uninitialised(SanaVideoTransformer3DModel, video_config, torch.bfloat16)
    reference = SanaVideoTransformer3DModel.from_config(video_config).to(torch.bfloat16)
    assert dict(video.named_buffers()).keys() == {"rope.freqs_cos", "rope.freqs_sin"}  # not stored in checkpoints
    assert all(torch.equal(b, dict(reference.named_buffers())[k]) for k, b in video.named_buffers())

    def only_on_meta(init):
        def wrapped(tensor, *args, **kwargs):
            assert tensor.is_meta, f"random initialisation of real {tuple(tensor.shape)} weights ran"
            return init(tensor, *args, **kwargs)
        return wrapped

    for name in ("normal_", "uniform_", "xavier_uniform_", "kaiming_uniform_", "trunc_normal_", "zeros_", "constant_"):
        monkeypatch.setattr(torch.nn.init, name, only_on_meta(getattr(torch.nn.init, name)))
    image_config = SanaTransformer2DModel.load_config(tiny_image_pipeline_dir / "transformer")
    image = _uninitialised(SanaTransformer2DModel, image_config, torch.bfloat16)
    assert {(p.device.type, p.dtype) for p in image.parameters()} == {("cpu", torch.bfloat16)}


def test_native_source_needs_base(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "model.pth"
    src.write_bytes(b"")
    assert main(["convert-to-dcp", str(src), "--out", str(tmp_path / "o")]) == 1
    assert "--base" in capsys.readouterr().err


def test_check_sample_rejects_constant_and_nan() -> None:
    from cosmos_sana.export import VerificationFailed
    from cosmos_sana.export.verify import check_sample

    with pytest.raises(VerificationFailed, match="constant"):
        check_sample(torch.full((1, 3, 8, 8), 0.5))
    with pytest.raises(VerificationFailed, match="1 NaN/inf values of 192"):
        check_sample(torch.rand(1, 3, 8, 8).index_put_((torch.tensor([0]),) * 4, torch.tensor(float("nan"))))
    assert check_sample(torch.linspace(0, 1, 192).view(1, 3, 8, 8))["max"] == 1.0
