"""``cosmos-sana generate`` on tiny SANA pipelines (CPU): checkpoints, every diffusers-loadable export, pipelines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_sana.checkpoint import ModelState, ParameterEMA, save_checkpoint
from cosmos_sana.cli import main

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
PROMPT = "a red apple on a table"
RUN_CONFIG = {
    "policy": {"lora": {"r": 4, "lora_alpha": 8},
               "diffusers": {"dtype": "float32", "inference_size": [64, 64],
                             "sample": {"eval_num_steps": 2, "guidance_scale": 2.0}}},
    "train": {"ema_enable": True, "train_policy": {"type": "grpo", "trainer_type": "sana_nft"}},
}
SMALL = ["--steps", "2", "--size", "64"]


def pixels(path: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def record(out: Path) -> dict:
    return json.loads((out / "generate.json").read_text())


def images(out: Path, which: str = "trained") -> list[np.ndarray]:
    return [pixels(out / name) for name in record(out)["files"][which]]


def assert_same_images(a: list[np.ndarray], b: list[np.ndarray], levels: int = 1) -> None:
    """Equal up to ``levels`` of 255 per pixel (float rounding of different but equivalent computations)."""
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.shape == y.shape and int(np.abs(x - y).max()) <= levels


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> Path:
    """A LoRA run checkpoint: adapters 'default' (trained) and 'old', and an EMA of 'default' that differs from it."""
    from diffusers import SanaTransformer2DModel
    from peft import LoraConfig

    transformer = SanaTransformer2DModel.from_pretrained(tiny_image_pipeline_dir, subfolder="transformer").eval()
    transformer.requires_grad_(False)
    config = LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian", target_modules=TARGETS)
    for name in ("default", "old"):
        transformer.add_adapter(config, adapter_name=name)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
                p.requires_grad_(".default." in name)
    ema = ParameterEMA(transformer, decay=0.9)
    ema.shadow = {k: v * 0.25 for k, v in ema.shadow.items()}
    parts = {"model": ModelState(transformer, lora_only=True, base_pipeline=str(tiny_image_pipeline_dir)), "ema": ema}
    return save_checkpoint(tmp_path_factory.mktemp("gen_run"), 3, parts, config=RUN_CONFIG)


@pytest.fixture(scope="module")
def from_checkpoint(checkpoint: Path) -> Path:
    """Generated with every setting from the run (no --out: the default folder beside the run)."""
    assert main(["generate", str(checkpoint), "--prompt", PROMPT, "--batch", "2", "--device", "cpu"]) == 0
    return checkpoint.parent.parent / "generated" / "iter_000000003-ema"


def test_checkpoint_generation_takes_base_lora_ema_and_settings_from_the_run(from_checkpoint: Path, checkpoint: Path,
                                                                             tiny_image_pipeline_dir: Path) -> None:
    got = record(from_checkpoint)
    assert got["source_kind"] == "checkpoint" and got["step"] == 3 and got["adapter"] == "default" and got["ema"]
    assert got["base_pipeline"] == str(tiny_image_pipeline_dir.resolve())
    assert got["settings"]["steps"] == 2 and got["settings"]["guidance"] == 2.0
    assert got["seeds"] == [0, 1] and got["media_shape"] == [3, 64, 64] and got["prompts"] == [PROMPT]
    assert got["files"]["trained"] == [f"000-a-red-apple-on-a-table-seed{s}.png" for s in (0, 1)]
    out = from_checkpoint.parent / "no-ema"
    assert main(["generate", str(checkpoint), "--prompt", PROMPT, "--batch", "2", "--no-ema", "--out", str(out)]) == 0
    assert not record(out)["ema"]
    assert max(int(np.abs(a - b).max()) for a, b in zip(images(out), images(from_checkpoint))) > 2


@pytest.mark.parametrize("fmt", ["lora", "merged"])
def test_lora_and_merged_exports_generate_what_the_checkpoint_does(fmt: str, from_checkpoint: Path, checkpoint: Path,
                                                                   tmp_path: Path, capsys) -> None:
    export = tmp_path / fmt
    assert main(["export", str(checkpoint), "--format", fmt, "--ema", "--out", str(export)]) == 0
    out = tmp_path / "images"
    assert main(["generate", str(export), "--prompt", PROMPT, "--batch", "2", "--out", str(out)]) == 0
    assert f"wrote 2 files to {out.resolve()}" in capsys.readouterr().out
    got = record(out)
    assert got["source_kind"] == "export" and got["format"] == fmt and got["settings"]["steps"] == 2  # the run's
    assert_same_images(images(out), images(from_checkpoint))


def test_full_checkpoint_diffusers_export_and_pipeline_folder_agree(tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    converted = tmp_path / "dcp"
    assert main(["convert-to-dcp", str(tiny_image_pipeline_dir), "--out", str(converted)]) == 0
    export = tmp_path / "export"
    assert main(["export", str(converted), "--format", "diffusers", "--out", str(export)]) == 0
    outs = {}
    for name, source in (("checkpoint", converted), ("diffusers", export), ("pipeline", tiny_image_pipeline_dir)):
        outs[name] = tmp_path / f"out-{name}"
        assert main(["generate", str(source), "--prompt", PROMPT, *SMALL, "--out", str(outs[name])]) == 0
    assert_same_images(images(outs["checkpoint"]), images(outs["pipeline"]), levels=0)
    assert_same_images(images(outs["diffusers"]), images(outs["pipeline"]), levels=0)


def test_seeds_are_per_image_and_runs_repeat(tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "batch"
    args = ["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, "--prompt", "a blue car", *SMALL,
            "--seed", "5", "--batch", "3", "--out", str(out)]
    assert main(args) == 0
    first = {name: (out / name).read_bytes() for name in record(out)["files"]["trained"]}
    assert len(first) == 6 and "001-a-blue-car-seed7.png" in first
    assert main(args) == 0  # the earlier output is replaced, byte for byte the same
    assert {name: (out / name).read_bytes() for name in record(out)["files"]["trained"]} == first
    single = tmp_path / "single"
    assert main(["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, *SMALL, "--seed", "6",
                 "--out", str(single)]) == 0
    assert_same_images([pixels(single / "000-a-red-apple-on-a-table-seed6.png")],
                       [pixels(out / "000-a-red-apple-on-a-table-seed6.png")])
    assert not np.array_equal(pixels(out / "000-a-red-apple-on-a-table-seed5.png"),
                              pixels(out / "000-a-red-apple-on-a-table-seed6.png"))


def test_compare_base_writes_base_and_trained_side_by_side(checkpoint: Path, tiny_image_pipeline_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "compare"
    assert main(["generate", str(checkpoint), "--prompt", PROMPT, "--batch", "2", "--compare-base",
                 "--out", str(out)]) == 0
    got = record(out)
    assert got["grid_columns"] == ["base", "trained"] and len(got["files"]["base"]) == 2
    (grid_name,) = got["files"]["grids"]
    grid = pixels(out / grid_name)
    assert grid.shape == (128, 128, 3)  # a row per seed, base | trained, 64² each
    base, trained = images(out, "base"), images(out)
    for row in range(2):
        assert np.array_equal(grid[row * 64:(row + 1) * 64, :64], base[row])
        assert np.array_equal(grid[row * 64:(row + 1) * 64, 64:], trained[row])
    plain = tmp_path / "plain-base"
    assert main(["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, "--batch", "2", *SMALL,
                 "--guidance", "2", "--out", str(plain)]) == 0
    assert_same_images(base, images(plain), levels=0)
    assert max(int(np.abs(a - b).max()) for a, b in zip(base, trained)) > 2


def test_video_pipeline_writes_mp4(tiny_video_pipeline_dir: Path, tmp_path: Path) -> None:
    av = pytest.importorskip("av")
    out = tmp_path / "video"
    assert main(["generate", str(tiny_video_pipeline_dir), "--prompt", PROMPT, *SMALL, "--frames", "5",
                 "--guidance", "1", "--out", str(out)]) == 0
    (name,) = record(out)["files"]["trained"]
    assert name.endswith(".mp4") and record(out)["media_shape"][0] == 5
    with av.open(str(out / name)) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 5 and (frames[0].height, frames[0].width) == (64, 64)


def test_bad_requests_name_the_problem(checkpoint: Path, tiny_image_pipeline_dir: Path, tmp_path: Path, capsys) -> None:
    comfy = tmp_path / "comfy"
    assert main(["export", str(checkpoint), "--format", "comfyui", "--out", str(comfy)]) == 0
    cases = [
        (["generate", str(comfy), "--prompt", PROMPT], "a 'comfyui' export holds no weights diffusers loads"),
        (["generate", str(tiny_image_pipeline_dir)], "no prompt: pass --prompt"),
        (["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, "--compare-base", "--out", str(tmp_path / "x")],
         "no known base; pass --base"),
        (["generate", str(comfy), "--prompt", PROMPT, "--ema"], "--ema/--adapter choose checkpoint weights"),
        (["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, "--prompts", str(tmp_path / "missing.txt")],
         "missing.txt: cannot read it"),
    ]
    for args, message in cases:
        assert main(args) == 1, args
        assert message in capsys.readouterr().err, args
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert main(["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, *SMALL, "--out", str(foreign)]) == 1
    assert "holds no generate.json" in capsys.readouterr().err and (foreign / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--steps", "0", "must be at least 1"), ("--batch", "0", "must be at least 1"),
    ("--guidance", "nan", "must be a finite number"), ("--frames", "4", "must be 4k + 1"),
    ("--device", "bogus", "is not a torch device"),
])
def test_bad_option_values_are_usage_errors(tiny_image_pipeline_dir: Path, tmp_path: Path, capsys, option: str,
                                            value: str, words: str) -> None:
    """Refused while parsing, before a model is loaded or --out touched (``--steps 0`` once wrote pure noise)."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, option, value, "--out", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and words in err and "Traceback" not in err
    assert not out.exists()


def test_frames_for_an_image_pipeline_and_non_finite_samples_are_refused(
    tiny_image_pipeline_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "frames"
    assert main(["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, *SMALL, "--frames", "5",
                 "--out", str(out)]) == 1
    assert "--frames 5: SanaPipeline samples images, not videos" in capsys.readouterr().err
    import cosmos_sana.model_hooks as hooks

    monkeypatch.setattr(hooks, "generator_for", lambda _cls: lambda _pipe, request: torch.full(
        (len(request.seeds), 3, 8, 8), float("nan")))  # the injected fault: a model that samples NaN
    out = tmp_path / "nan"
    assert main(["generate", str(tiny_image_pipeline_dir), "--prompt", PROMPT, "--out", str(out)]) == 1
    assert f"the trained model sampled NaN/inf for prompt 0 ({PROMPT!r}, seeds [0])" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_corrupt_run_config_is_named(checkpoint: Path, tmp_path: Path, capsys) -> None:
    import shutil

    copy = tmp_path / "run" / "checkpoints" / checkpoint.name
    shutil.copytree(checkpoint, copy)
    (copy / "run_config.json").write_text("{ not json")
    assert main(["generate", str(copy), "--prompt", PROMPT, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {copy / 'run_config.json'}: invalid JSON"), err


def test_out_inside_the_checkpoint_is_refused(checkpoint: Path, capsys) -> None:
    out = checkpoint / "samples"
    assert main(["generate", str(checkpoint), "--prompt", PROMPT, "--out", str(out)]) == 1
    assert f"--out {out}: inside the checkpoint {checkpoint}" in capsys.readouterr().err
    assert not out.exists()
