"""``data check PATH`` judges every layout as a run would: manifests and SANA ``meta_data.json``
folders of images are clean, an empty folder fails, and the Hugging Face imagefolder layout
(``metadata.jsonl`` with ``file_name`` + ``text``) is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_data import BLUE, GREEN, RED, solid, write_image, write_video

from cosmos_sana.cli import main
from cosmos_sana_plugins.datasets.errors import BadSamplePolicy
from cosmos_sana_plugins.datasets.media import ImageDataset
from cosmos_sana_plugins.datasets.params import ImageDataParams

CHECK = ["--size", "8", "8", "--num-frames", "4", "--json"]


def check(path: Path, capsys, *extra: str) -> tuple[int, dict]:
    code = main(["data", "check", str(path), *CHECK, *extra])
    (report,) = json.loads(capsys.readouterr().out)
    return code, report


def write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_clean_jsonl_manifest_of_images_passes(tmp_path, capsys):
    write_image(tmp_path / "a.png", solid(16, 16, RED))
    write_image(tmp_path / "b.png", solid(16, 32, BLUE))
    manifest = write_lines(tmp_path / "train.jsonl", [{"media": "a.png", "caption": "red"},
                                                      {"media": "b.png", "caption": "blue"}])
    code, report = check(manifest, capsys)
    assert (code, report["verdict"], report["bad"]) == (0, "OK", 0)
    assert report["counts"] == {"jsonl/image": 2}


def test_sana_meta_folder_of_images_passes(tmp_path, capsys):
    for name, colour in (("x", RED), ("y", GREEN)):
        write_image(tmp_path / f"{name}.png", solid(16, 16, colour))
        (tmp_path / f"{name}.txt").write_text(name)
    (tmp_path / "meta_data.json").write_text(json.dumps({"img_names": ["x", "y.png"]}))
    code, report = check(tmp_path, capsys)
    assert (code, report["verdict"], report["bad"]) == (0, "OK", 0)
    assert report["counts"] == {"sana_meta/image": 2}


def test_mixed_manifest_counts_each_modality_and_each_bad_entry_once(tmp_path, capsys):
    write_image(tmp_path / "a.png", solid(16, 16, RED))
    write_video(tmp_path / "v.mp4", num_frames=8)
    manifest = write_lines(tmp_path / "m.jsonl", [{"media": "a.png", "caption": "img"},
                                                  {"media": "v.mp4", "caption": "clip"},
                                                  {"media": "gone.png", "caption": "missing"}])
    code, report = check(manifest, capsys)
    assert code == 1 and report["counts"] == {"jsonl/image": 1, "jsonl/video": 1}
    assert [(b["where"], b["reason"]) for b in report["bad_samples"]] == [
        (f"{manifest}:3", f"media file {tmp_path / 'gone.png'} does not exist")
    ]


def test_empty_folder_fails_under_either_policy(tmp_path, capsys):
    for policy in ("fail", "skip"):
        code, report = check(tmp_path, capsys, "--on-bad-sample", policy)
        assert (code, report["verdict"], report["good"]) == (1, "FAIL", 0)
        assert report["problems"] == ["no usable sample found (supported layouts: README 'Data')"]


@pytest.fixture
def imagefolder(tmp_path: Path) -> Path:
    """Hugging Face imagefolder: images in subfolders, ``metadata.jsonl`` with ``file_name`` and ``text``."""
    root = tmp_path / "hf"
    write_image(root / "train" / "0001.png", solid(16, 16, RED))
    write_image(root / "train" / "0002.jpg", solid(16, 16, BLUE))
    write_lines(root / "metadata.jsonl", [{"file_name": "train/0001.png", "text": "a red square", "score": 5},
                                          {"file_name": "train/0002.jpg", "text": "a blue square"}])
    return root


def test_hf_imagefolder_layout_is_detected_and_read(imagefolder, capsys):
    code, report = check(imagefolder, capsys)
    assert (code, report["counts"], report["bad"]) == (0, {"imagefolder/image": 2}, 0)
    dataset = ImageDataset(ImageDataParams(path=str(imagefolder)), (8, 8), BadSamplePolicy("fail", "hf"), None)
    first = dataset[0]
    assert (first["key"], first["prompt"], first["metadata"]) == ("train/0001.png", "a red square", {"score": 5})
    assert dataset[1]["prompt"] == "a blue square"


def test_hf_imagefolder_record_without_text_is_named(imagefolder, capsys):
    write_lines(imagefolder / "metadata.jsonl", [{"file_name": "train/0001.png", "text": "red"},
                                                 {"file_name": "train/0002.jpg", "caption": "blue"}])
    code, report = check(imagefolder, capsys)
    assert code == 1 and report["bad_samples"] == [
        {"where": f"{imagefolder / 'metadata.jsonl'}:2", "reason": "missing 'text'"}
    ]


def test_report_is_not_contradicted_by_skip_warnings(tmp_path):
    """A ``fail`` verdict is not preceded by "skipping bad sample (on_bad_sample=skip)" lines."""
    write_image(tmp_path / "a.png", solid(16, 16, RED))
    (tmp_path / "a.txt").write_text("red")
    write_image(tmp_path / "nocap.png", solid(16, 16, RED))
    out = subprocess.run([sys.executable, "-m", "cosmos_sana.cli", "data", "check", str(tmp_path), "--size", "8", "8"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "BAD " in out.stdout and "verdict: a run would FAIL" in out.stdout
    assert "skipping" not in out.stdout + out.stderr


def test_recipe_check_skips_validation_data_a_run_would_not_load(tmp_path, imagefolder, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[train]\noutput_dir = "out"\n[validation]\nenable = false\n[policy.diffusers]\n'
                      f'inference_size = [8, 8]\n[custom]\npackage = "cosmos-sana"\n'
                      f'[custom.data]\nname = "images"\nargs = {{ path = "{imagefolder}" }}\n'
                      f'[custom.val_data]\nname = "images"\nargs = {{ path = "{tmp_path / "no-val"}" }}\n')
    assert main(["data", "check", str(recipe), "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["counts"] for r in json.loads(captured.out)] == [{"imagefolder/image": 2}]
    assert "custom.val_data (images): not checked" in captured.err
    recipe.write_text(recipe.read_text().replace("enable = false", "enable = true"))
    assert main(["data", "check", str(recipe)]) == 1
    assert "no-val: no such file or directory" in capsys.readouterr().err


def test_hf_imagefolder_metadata_file_given_directly(imagefolder, capsys):
    code, report = check(imagefolder / "metadata.jsonl", capsys)
    assert (code, report["counts"], report["bad"]) == (0, {"imagefolder/image": 2}, 0)


def test_imagefolder_split_subfolder_and_csv_metadata_name_the_fix(tmp_path, capsys):
    """An imagefolder whose metadata.jsonl sits in a split folder, or whose metadata is a CSV, reads as the
    ``folder`` layout: each image's missing caption says which file was not read and what to do."""
    split = tmp_path / "hf" / "train"
    write_image(split / "0001.png", solid(16, 16, RED))
    write_lines(split / "metadata.jsonl", [{"file_name": "0001.png", "text": "a red square"}])
    code, report = check(tmp_path / "hf", capsys)
    assert code == 1 and [b["reason"] for b in report["bad_samples"]] == [
        f"missing caption: neither 0001.txt nor 0001.json beside it; {split / 'metadata.jsonl'} is read when the "
        f"dataset path is {split} itself"]
    assert check(split, capsys)[1]["counts"] == {"imagefolder/image": 1}
    csv = tmp_path / "csv"
    write_image(csv / "0001.png", solid(16, 16, RED))
    (csv / "metadata.csv").write_text("file_name,text\n0001.png,a red square\n")
    code, report = check(csv, capsys)
    assert code == 1 and f"{csv / 'metadata.csv'} is not read: write it as metadata.jsonl" in report["bad_samples"][0]["reason"]


def test_recipe_check_names_the_table_of_a_missing_dataset(tmp_path, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[train]\noutput_dir = "out"\n[policy.diffusers]\ninference_size = [8, 8]\n[custom]\n'
                      f'package = "cosmos-sana"\n[custom.data]\nname = "images"\n'
                      f'args = {{ path = "{tmp_path / "gone"}" }}\n')
    assert main(["data", "check", str(recipe)]) == 1
    assert f"FAIL: custom.data (images): {tmp_path / 'gone'}: no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "message"), [
    (["--size", "0", "0"], "argument --size: must be at least 1, got 0"),
    (["--stride", "0"], "argument --stride: must be at least 1, got 0"),
    (["--num-frames", "x"], "argument --num-frames: expected a whole number, got 'x'"),
    (["--fps", "nan"], "argument --fps: must be a finite number, got 'nan'"),
])
def test_bad_decode_options_are_usage_errors_not_tracebacks(option, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "check", str(tmp_path), *option])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
