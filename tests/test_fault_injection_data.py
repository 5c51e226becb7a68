"""Fault injection, datasets: files that lead outside the dataset root, and broken samples.

Each hostile or broken sample sits beside one good sample; ``cosmos-sana data check`` must list it
by name with its reason (and pass the good one), and building the dataset with
``on_bad_sample="fail"`` must stop naming it. Nothing outside the root is ever read as a sample.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures_data import GREEN, RED, solid, write_image

from cosmos_sana.cli import main
from cosmos_sana_plugins.datasets.errors import BadSampleError
from cosmos_sana_plugins.datasets.media import build_images
from cosmos_sana_plugins.datasets.params import ImageDataParams

OUTSIDE_CAPTION = "root:x:0:0:root:/root:/bin/bash"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Files beside, not inside, the dataset folder: a 'private' image and a passwd-like caption."""
    folder = tmp_path / "private"
    write_image(folder / "secret.png", solid(16, 16, RED))
    (folder / "passwd").write_text(OUTSIDE_CAPTION + "\n")
    (folder / "album").mkdir()
    write_image(folder / "album" / "x.png", solid(16, 16, RED))
    (folder / "album" / "x.txt").write_text("private album")
    return folder


def good_folder(root: Path) -> Path:
    write_image(root / "good.png", solid(16, 16, GREEN))
    (root / "good.txt").write_text("a green square")
    return root


def _image_link(root: Path, outside: Path) -> Path:
    (root / "leak.png").symlink_to(outside / "secret.png")
    (root / "leak.txt").write_text("looks innocent")
    return root


def _caption_link(root: Path, outside: Path) -> Path:
    write_image(root / "leak.png", solid(16, 16, GREEN))
    (root / "leak.txt").symlink_to(outside / "passwd")
    return root


def _folder_link(root: Path, outside: Path) -> Path:
    (root / "leak").symlink_to(outside / "album", target_is_directory=True)
    return root


def _jsonl_link(root: Path, outside: Path) -> Path:
    (root / "leak.png").symlink_to(outside / "secret.png")
    lines = [{"media": "good.png", "caption": "a green square"}, {"media": "leak.png", "caption": "innocent"}]
    (root / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root / "data.jsonl"


def _sana_meta_link(root: Path, outside: Path) -> Path:
    (root / "leak.png").symlink_to(outside / "secret.png")
    (root / "leak.txt").write_text("innocent")
    (root / "meta_data.json").write_text(json.dumps({"img_names": ["good", "leak"]}))
    return root


def _zip_link(root: Path, outside: Path) -> Path:
    archive = outside / "clips.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.write(outside / "secret.png", "leak.png")
        handle.writestr("leak.txt", "innocent")
    (root / "clips.zip").symlink_to(archive)
    return root


def _jsonl_parent(root: Path, outside: Path) -> Path:
    lines = [{"media": "good.png", "caption": "a green square"}, {"media": "../private/secret.png", "caption": "x"}]
    (root / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root / "data.jsonl"


def _jsonl_absolute(root: Path, outside: Path) -> Path:
    lines = [{"media": "good.png", "caption": "a green square"}, {"media": str(outside / "secret.png"), "caption": "x"}]
    (root / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root / "data.jsonl"


def _sana_meta_parent(root: Path, outside: Path) -> Path:
    (root / "meta_data.json").write_text(json.dumps({"img_names": ["good", "../private/secret"]}))
    return root


def _imagefolder_link(root: Path, outside: Path) -> Path:
    (root / "leak.png").symlink_to(outside / "secret.png")
    lines = [{"file_name": "good.png", "text": "a green square"}, {"file_name": "leak.png", "text": "innocent"}]
    (root / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def _imagefolder_parent(root: Path, outside: Path) -> Path:
    lines = [{"file_name": "good.png", "text": "a green square"}, {"file_name": "../private/secret.png", "text": "x"}]
    (root / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


ESCAPES: dict[str, tuple[Callable[[Path, Path], Path], str, str]] = {
    # case: (build the dataset beside ``outside``; the file the error names; words of the reason)
    "image symlink": (_image_link, "leak.png", "outside the dataset root"),
    "caption symlink to a passwd file": (_caption_link, "leak.txt", "outside the dataset root"),
    "folder symlink": (_folder_link, "leak", "outside the dataset root"),  # the link, its files never listed
    "jsonl media symlink": (_jsonl_link, "leak.png", "outside the dataset root"),
    "sana_meta media symlink": (_sana_meta_link, "leak.png", "outside the dataset root"),
    "zip archive symlink": (_zip_link, "clips.zip", "outside the dataset root"),
    "jsonl ../ path": (_jsonl_parent, "data.jsonl:2", "escapes the dataset root"),
    "jsonl absolute path": (_jsonl_absolute, "data.jsonl:2", "escapes the dataset root"),
    "sana_meta ../ name": (_sana_meta_parent, "meta_data.json[img_names][1]", "escapes the dataset root"),
    "imagefolder media symlink": (_imagefolder_link, "leak.png", "outside the dataset root"),
    "imagefolder ../ file_name": (_imagefolder_parent, "metadata.jsonl:2", "escapes the dataset root"),
}


def built(tmp_path: Path, outside: Path, case: str) -> tuple[Path, str, str]:
    make, named, words = ESCAPES[case]
    root = good_folder(tmp_path / "data")
    return make(root, outside), str(root / named), words


@pytest.mark.fault("refused")
@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_escape_is_named_by_data_check(case: str, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture) -> None:
    path, named, words = built(tmp_path, outside, case)
    assert main(["data", "check", str(path), "--size", "16", "16", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)[0]
    assert report["verdict"] == "FAIL"
    assert (named, True) in [(b["where"], words in b["reason"]) for b in report["bad_samples"]]
    assert sum(n for key, n in report["counts"].items() if key.endswith("/image")) == 1  # the good sample


@pytest.mark.fault("refused")
@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_escape_stops_training_data_or_is_skipped(case: str, tmp_path: Path, outside: Path) -> None:
    path, named, words = built(tmp_path, outside, case)
    with pytest.raises(BadSampleError) as info:
        build_images(ImageDataParams(path=str(path), size=(16, 16)), on_bad_sample="fail")
    assert str(info.value).startswith(named) and words in str(info.value)
    skipping = build_images(ImageDataParams(path=str(path), size=(16, 16)), on_bad_sample="skip")
    assert [item["prompt"] for item in skipping] == ["a green square"]


@pytest.mark.fault("contained")
@pytest.mark.parametrize("case", ["image symlink", "caption symlink to a passwd file", "folder symlink"])
def test_links_outside_are_read_only_when_allowed(case: str, tmp_path: Path, outside: Path) -> None:
    path, _, _ = built(tmp_path, outside, case)
    params = ImageDataParams(path=str(path), size=(16, 16), allow_outside_root=True)
    prompts = sorted(item["prompt"] for item in build_images(params, on_bad_sample="fail"))
    expected = {"image symlink": "looks innocent", "caption symlink to a passwd file": OUTSIDE_CAPTION,
                "folder symlink": "private album"}[case]
    assert prompts == sorted(["a green square", expected])


def test_links_inside_the_root_are_ordinary_samples(tmp_path: Path) -> None:
    """Not a fault case: a link to another file of the same dataset is fine."""
    root = good_folder(tmp_path / "data")
    (root / "again.png").symlink_to(root / "good.png")
    (root / "again.txt").write_text("the same square")
    dataset = build_images(ImageDataParams(path=str(root), size=(16, 16)), on_bad_sample="fail")
    assert sorted(item["prompt"] for item in dataset) == ["a green square", "the same square"]


@pytest.mark.fault("contained")
def test_folder_link_cycle_ends(tmp_path: Path) -> None:
    root = good_folder(tmp_path / "data")
    (root / "loop").symlink_to(root, target_is_directory=True)
    dataset = build_images(ImageDataParams(path=str(root), size=(16, 16)), on_bad_sample="fail")
    assert [ref.key for ref in dataset.refs] == ["good.png"]


def test_linked_manifest_and_archive_read_beside_their_names(tmp_path: Path, outside: Path) -> None:
    """Not a fault case: the dataset named by a link (a manifest or an archive kept elsewhere) is
    what the user asked for; a manifest's media are found beside the name it was given by."""
    root = good_folder(tmp_path / "data")
    (outside / "data.jsonl").write_text(json.dumps({"media": "good.png", "caption": "a green square"}) + "\n")
    (root / "data.jsonl").symlink_to(outside / "data.jsonl")
    manifest = build_images(ImageDataParams(path=str(root / "data.jsonl"), size=(16, 16)), on_bad_sample="fail")
    assert [item["prompt"] for item in manifest] == ["a green square"]
    with zipfile.ZipFile(outside / "set.zip", "w") as handle:
        handle.write(outside / "secret.png", "a.png")
        handle.writestr("a.txt", "zipped")
    (root / "set.zip").symlink_to(outside / "set.zip")
    archive = build_images(ImageDataParams(path=str(root / "set.zip"), size=(16, 16)), on_bad_sample="fail")
    assert [item["prompt"] for item in archive] == ["zipped"]


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    # case: (write a broken sample ``bad.*`` into the folder; words of the reason)
    "not an image": (lambda r: ((r / "bad.png").write_bytes(b"GIF89a no"), (r / "bad.txt").write_text("x")),
                     "unreadable image"),
    "empty image file": (lambda r: ((r / "bad.png").write_bytes(b""), (r / "bad.txt").write_text("x")),
                         "unreadable image"),
    "truncated png": (lambda r: (write_image(r / "bad.png", solid(64, 64, RED)),
                                 (r / "bad.png").write_bytes((r / "bad.png").read_bytes()[:60]),
                                 (r / "bad.txt").write_text("x")), "image"),
    "no caption": (lambda r: write_image(r / "bad.png", solid(8, 8, RED)), "missing caption"),
    "blank caption": (lambda r: (write_image(r / "bad.png", solid(8, 8, RED)), (r / "bad.txt").write_text("\n\n")),
                      "empty caption"),
    "caption not UTF-8": (lambda r: (write_image(r / "bad.png", solid(8, 8, RED)),
                                     (r / "bad.txt").write_bytes(b"\xff\xfe\x00bad")), "not UTF-8"),
    "json caption without prompt": (lambda r: (write_image(r / "bad.png", solid(8, 8, RED)),
                                               (r / "bad.json").write_text('{"text": "x"}')), "missing 'prompt'"),
    "json caption invalid": (lambda r: (write_image(r / "bad.png", solid(8, 8, RED)),
                                        (r / "bad.json").write_text("{oops")), "invalid JSON"),
    "caption without image": (lambda r: (r / "bad.txt").write_text("orphan"), "caption without a media file"),
    "dangling image symlink": (lambda r: ((r / "bad.png").symlink_to(r / "gone.png"), (r / "bad.txt").write_text("x")),
                               "caption without a media file"),
}


@pytest.mark.fault("refused")
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_sample_is_named_by_data_check(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write, words = BROKEN[case]
    root = good_folder(tmp_path / "data")
    write(root)
    assert main(["data", "check", str(root), "--size", "16", "16", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)[0]
    assert len(report["bad_samples"]) == 1, report["bad_samples"]
    bad = report["bad_samples"][0]
    assert Path(bad["where"]).name.startswith("bad.") and words in bad["reason"], bad
    assert sum(report["counts"].values()) == 1


@pytest.mark.fault("refused")
def test_link_to_an_ancestor_is_one_bad_sample_and_is_not_walked(
    tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture
) -> None:
    """A link to a folder above the root (here the folder holding ``private/`` too) is named once; the
    tree it leads to is not listed, so none of its files appear as samples or as bad samples."""
    root = good_folder(tmp_path / "data")
    (root / "up").symlink_to(tmp_path, target_is_directory=True)
    assert main(["data", "check", str(root), "--size", "16", "16", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)[0]
    assert [bad["where"] for bad in report["bad_samples"]] == [str(root / "up")]
    assert "outside the dataset root" in report["bad_samples"][0]["reason"]
    assert sum(report["counts"].values()) == 1
