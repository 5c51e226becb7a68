"""Exports of LoRA runs that did not start from the pipeline's own transformer: a native SANA
checkpoint (Sol-RL's LinearFFN layout, ``[custom.model] native_checkpoint``) or a DCP folder
(``[custom.checkpoint] init_from``). Merging, verifying and the manifest must use those weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from fixtures_trainers import build_trainer, recipe
from PIL import Image

from cosmos_sana.checkpoint import ModelState, save_checkpoint
from cosmos_sana.cli import main

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(2, 6, 32, generator=g),
        "timestep": torch.tensor([250.0, 750.0]),
    }


@torch.no_grad()
def forward(transformer: torch.nn.Module) -> torch.Tensor:
    return transformer(**inputs(), return_dict=False)[0]


def stock(pipeline: Path) -> torch.nn.Module:
    from diffusers import SanaTransformer2DModel

    return SanaTransformer2DModel.from_pretrained(pipeline, subfolder="transformer").eval()


def perturbed(pipeline: Path, seed: int) -> torch.nn.Module:
    """The stock transformer with every weight moved: a base that differs from the pipeline's everywhere."""
    transformer = stock(pipeline)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in transformer.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return transformer


def lora_targets(transformer: torch.nn.Module) -> set[str]:
    """Plain weight keys of the layers a LoRA wraps (``….to_q.weight``)."""
    return {k.replace(".base_layer", "") for k in transformer.state_dict() if ".base_layer.weight" in k}


def plain_weights(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k.replace(".base_layer", ""): v for k, v in transformer.state_dict().items() if "lora_" not in k}


def load_merged(out: Path) -> torch.nn.Module:
    from diffusers import SanaPipeline

    return SanaPipeline.from_pretrained(out).transformer


def files_equal(a: Path, b: Path) -> bool:
    def read(folder: Path) -> dict[str, bytes]:
        return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    return read(a) == read(b)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def native_run(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path, cosmos_registries):
    """Two LoRA SFT steps of the registered trainer on a LinearFFN native checkpoint; the checkpoint it saved."""
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory
    from cosmos_sana_plugins.sana.native_checkpoint import save_native

    root = tmp_path_factory.mktemp("native_run")
    native_model = perturbed(tiny_image_pipeline_dir, seed=11)
    native = save_native(native_model, root / "SANA_LinearFFN.pth", linear_ffn=True)
    data = root / "data"
    data.mkdir()
    for i in range(4):
        Image.new("RGB", (48, 40), (50 * i, 200 - 40 * i, 90)).save(data / f"s{i}.png")
        (data / f"s{i}.txt").write_text(f"a flat colour number {i}\n")
    ref = {"name": "images", "args": {"path": str(data)}}
    config = recipe("sana-image-sft-lora", tiny_image_pipeline_dir, root / "out", {
        "custom.data": ref, "custom.val_data": ref, "custom.model.native_checkpoint": str(native),
    })
    trainer = build_trainer(config)
    dataset = dataset_factory(installed_plugins(), "data")(config)
    batch = [trainer.data_packer.sft_process_sample(dataset[i]) for i in range(len(dataset))]
    for step in range(2):
        trainer.step_training(batch, total_steps=10, train_step=step, save_freq=10)
    checkpoint = trainer.save_training_state(2)
    trainer.model.transformer.set_adapter("default")
    return checkpoint, trainer.model.transformer, native_model, native


def test_merged_export_of_a_native_lora_run_keeps_the_native_weights(native_run, tiny_image_pipeline_dir, tmp_path):
    checkpoint, trained, native_model, native = native_run
    out = tmp_path / "merged"
    assert main(["export", str(checkpoint), "--out", str(out), "--format", "merged"]) == 0
    merged = load_merged(out).state_dict()
    native_weights, stock_weights = native_model.state_dict(), stock(tiny_image_pipeline_dir).state_dict()
    targets = lora_targets(trained)
    untouched = sorted(set(native_weights) - targets)
    assert len(untouched) > 20 and targets
    for key in untouched:  # the LoRA did not touch them: exactly the native checkpoint's
        assert torch.equal(merged[key], native_weights[key]), key
        assert not torch.equal(merged[key], stock_weights[key]), key
    # the wrapped layers: native W + (α/r)·B·A of the adapter the trainer holds
    layer = trained.transformer_blocks[0].attn1.to_q
    delta = layer.scaling["default"] * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    assert delta.abs().max() > 0  # two steps moved B off its zero initialisation
    key = "transformer_blocks.0.attn1.to_q.weight"
    torch.testing.assert_close(merged[key], native_weights[key] + delta, rtol=0, atol=1e-6)
    torch.testing.assert_close(forward(load_merged(out)), forward(trained), rtol=0, atol=1e-5)

    base = json.loads((out / "export_manifest.json").read_text())["base"]
    assert base["native_checkpoint"]["source"] == str(native) and base["native_checkpoint"]["use_ema"] is False
    assert base["native_checkpoint"]["sha256"] == sha256(native)
    assert base["native_checkpoint"]["bytes"] == native.stat().st_size
    assert base["pipeline"] == str(tiny_image_pipeline_dir.resolve()) and base["init_from"] is None


def test_lora_export_of_a_native_run_verifies_on_and_records_its_base(
    native_run, tiny_image_pipeline_dir, tmp_path, monkeypatch
):
    """``--verify`` generates with the native base; the manifest is enough to rebuild the trained model."""
    from diffusers import SanaPipeline

    from cosmos_sana.export import verify
    from cosmos_sana_plugins.sana.native_checkpoint import load_native_transformer

    checkpoint, trained, native_model, _ = native_run
    seen = {}
    real_generate = verify.generate_once

    def recording(pipe, options):
        seen["proj_out"] = pipe.transformer.proj_out.weight.detach().clone()
        return real_generate(pipe, options)

    monkeypatch.setattr(verify, "generate_once", recording)
    out = tmp_path / "lora"
    assert main(["export", str(checkpoint), "--out", str(out), "--verify", "--verify-size", "64"]) == 0
    assert torch.equal(seen["proj_out"], native_model.proj_out.weight)  # not the stock pipeline's

    base = json.loads((out / "export_manifest.json").read_text())["base"]
    transformer = load_native_transformer(base["native_checkpoint"]["path"], base_config=base["pipeline"])
    pipe = SanaPipeline.from_pretrained(base["pipeline"], transformer=transformer)
    pipe.load_lora_weights(out, weight_name="pytorch_lora_weights.safetensors")
    torch.testing.assert_close(forward(pipe.transformer), forward(trained), rtol=0, atol=1e-6)


def test_native_export_of_a_native_lora_run_maps_back_to_the_merged_weights(native_run, tiny_image_pipeline_dir, tmp_path):
    """… in the LinearFFN layout of the checkpoint the run started from (what Sol-RL's model loads)."""
    from cosmos_sana_plugins.sana.native_checkpoint import load_native_transformer, read_native_state_dict

    checkpoint, trained, native_model, native = native_run
    out = tmp_path / "native"
    assert main(["export", str(checkpoint), "--out", str(out), "--format", "native"]) == 0
    exported, started_from = read_native_state_dict(out / "sana_native.pth"), read_native_state_dict(native)
    assert exported.keys() == started_from.keys()
    assert exported["blocks.0.mlp.inverted_conv.linear.weight"].ndim == 2  # [O, I], not a 1×1 conv
    back = load_native_transformer(str(out / "sana_native.pth"), base_config=str(tiny_image_pipeline_dir))
    weights = back.state_dict()
    for key in sorted(set(weights) - lora_targets(trained)):
        assert torch.equal(weights[key], native_model.state_dict()[key]), key
    torch.testing.assert_close(forward(back), forward(trained), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def init_from_run(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path):
    """A LoRA checkpoint of a run with both a native checkpoint and ``init_from``: training loads the
    native weights, then overwrites every one of them from ``init_from``, so ``init_from`` is the base."""
    from peft import LoraConfig

    from cosmos_sana.checkpoint import load_model_weights
    from cosmos_sana_plugins.sana.native_checkpoint import save_native

    root = tmp_path_factory.mktemp("init_from_run")
    native = save_native(perturbed(tiny_image_pipeline_dir, seed=21), root / "native.pth")
    init_model = perturbed(tiny_image_pipeline_dir, seed=22)
    init_dir = root / "init_dcp"
    source = save_native(init_model, root / "init_source.pth")
    assert main(["convert-to-dcp", str(source), "--base", str(tiny_image_pipeline_dir), "--out", str(init_dir)]) == 0

    transformer = stock(tiny_image_pipeline_dir)
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian", target_modules=TARGETS))
    load_model_weights(init_dir, transformer)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    config = {"custom": {"model": {"native_checkpoint": str(native)}, "checkpoint": {"init_from": str(init_dir)}}}
    parts = {"model": ModelState(transformer, lora_only=True, base_pipeline=str(tiny_image_pipeline_dir))}
    return save_checkpoint(root / "run", 4, parts, config=config), transformer, init_model, init_dir


def test_merged_export_of_an_init_from_run_uses_the_init_weights(init_from_run, tmp_path):
    from cosmos_sana.export.base import fingerprint

    checkpoint, trained, init_model, init_dir = init_from_run
    out = tmp_path / "merged"
    assert main(["export", str(checkpoint), "--out", str(out), "--format", "merged"]) == 0
    merged, init_weights = load_merged(out).state_dict(), init_model.state_dict()
    for key in sorted(set(init_weights) - lora_targets(trained)):
        assert torch.equal(merged[key], init_weights[key]), key
    torch.testing.assert_close(forward(load_merged(out)), forward(trained), rtol=0, atol=1e-5)

    base = json.loads((out / "export_manifest.json").read_text())["base"]
    recorded = base["init_from"]
    assert recorded["source"] == str(init_dir) and recorded["path"] == str((init_dir / "model").resolve())
    files = sorted(p for p in (init_dir / "model").rglob("*") if p.is_file())
    listing = "".join(f"{sha256(p)}  {p.relative_to(init_dir / 'model').as_posix()}\n" for p in files)
    assert recorded["sha256"] == hashlib.sha256(listing.encode()).hexdigest() == fingerprint(init_dir / "model")["sha256"]
    assert recorded["files"] == len(files) >= 2

    import shutil

    copied = shutil.copytree(init_dir, tmp_path / "copied_init")  # the run's init_from, found elsewhere
    again = tmp_path / "again"
    assert main(["export", str(checkpoint), "--out", str(again), "--format", "merged", "--init-from", str(copied)]) == 0
    assert files_equal(again / "transformer", out / "transformer")
    moved = json.loads((again / "export_manifest.json").read_text())["base"]["init_from"]
    assert moved["source"] == str(copied) and moved["recorded_source"] == str(init_dir)
    assert moved["sha256"] == recorded["sha256"]  # the same files, so the same digest


def test_a_moved_native_checkpoint_is_named_and_can_be_given_anew(tiny_image_pipeline_dir, tmp_path, capsys):
    from peft import LoraConfig

    from cosmos_sana_plugins.sana.native_checkpoint import save_native

    transformer = stock(tiny_image_pipeline_dir)
    transformer.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=TARGETS))
    gone = tmp_path / "moved_away.pth"
    config = {"custom": {"model": {"native_checkpoint": str(gone)}}}
    parts = {"model": ModelState(transformer, lora_only=True, base_pipeline=str(tiny_image_pipeline_dir))}
    checkpoint = save_checkpoint(tmp_path / "run", 1, parts, config=config)
    out = tmp_path / "merged"
    assert main(["export", str(checkpoint), "--out", str(out), "--format", "merged"]) == 1
    err = capsys.readouterr().err
    assert f"custom.model.native_checkpoint (recorded in {checkpoint / 'run_config.json'}) {gone}" in err
    assert "not found" in err
    assert not out.exists() and not list(tmp_path.glob("merged.*"))

    assert main(["export", str(checkpoint), "--out", str(out), "--init-from", str(tmp_path)]) == 1
    assert "--init-from: the run did not use custom.checkpoint.init_from (not set in" in capsys.readouterr().err

    native_model = perturbed(tiny_image_pipeline_dir, seed=31)
    here = save_native(native_model, tmp_path / "elsewhere" / "native.pth")
    args = ["export", str(checkpoint), "--out", str(out), "--format", "merged", "--native-checkpoint", str(here)]
    assert main(args) == 0
    merged = load_merged(out).state_dict()
    for key in sorted(set(merged) - lora_targets(transformer)):
        assert torch.equal(merged[key], native_model.state_dict()[key]), key
    recorded = json.loads((out / "export_manifest.json").read_text())["base"]["native_checkpoint"]
    assert recorded["source"] == str(here) and recorded["recorded_source"] == str(gone)
    assert recorded["sha256"] == sha256(here)


def test_native_layout_follows_the_starting_checkpoint_or_is_named_when_unknown(tiny_image_pipeline_dir, tmp_path, caplog):
    from cosmos_sana_plugins.sana.native_checkpoint import read_native_state_dict, save_native
    from cosmos_sana_plugins.sana.native_keys import has_linear_ffn

    transformer = stock(tiny_image_pipeline_dir)
    linear = save_native(transformer, tmp_path / "linear.pth", linear_ffn=True)
    conv = save_native(transformer, tmp_path / "conv.safetensors")
    assert has_linear_ffn(read_native_state_dict(linear)) and not has_linear_ffn(read_native_state_dict(conv))
    assert has_linear_ffn(read_native_state_dict(save_native(transformer, tmp_path / "a.pth", layout_of=linear)))
    assert not has_linear_ffn(read_native_state_dict(save_native(transformer, tmp_path / "b.pth", layout_of=conv)))
    gone = tmp_path / "gone.pth"
    written = save_native(transformer, tmp_path / "c.pth", layout_of=gone)
    assert not has_linear_ffn(read_native_state_dict(written))
    assert f"writing {written} with conv FFN layers: the layout of {gone} is unknown" in caplog.text
