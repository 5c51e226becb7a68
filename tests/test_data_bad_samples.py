"""A corpus of broken inputs: one named error each under "fail", a reported skip under "skip"."""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest
from fixtures_data import RED, solid, write_image, write_video

from cosmos_sana_plugins.datasets.errors import BadSampleError
from cosmos_sana_plugins.datasets.media import build_images, build_videos
from cosmos_sana_plugins.datasets.params import ImageDataParams, VideoDataParams


def _good_image(root):
    write_image(root / "good.png", solid(8, 8, RED))
    (root / "good.txt").write_text("good")


def corrupt_png(root):
    _good_image(root)
    (root / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 8)
    (root / "bad.txt").write_text("corrupt")
    return root, "image", r"bad\.png: unreadable image"


def truncated_png(root):
    _good_image(root)
    buffer = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (64, 64), (1, 2, 3)).save(buffer, format="PNG", compress_level=0)
    (root / "bad.png").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (root / "bad.txt").write_text("truncated")
    return root, "image", r"bad\.png: unreadable image"


def truncated_mp4(root):
    write_video(root / "good.mp4", 3)
    (root / "good.txt").write_text("good")
    data = write_video(root / "tmp.mp4", 3).read_bytes()
    (root / "tmp.mp4").unlink()
    (root / "bad.mp4").write_bytes(data[: len(data) // 2])
    (root / "bad.txt").write_text("truncated")
    return root, "video", r"bad\.mp4: unreadable video"


def missing_caption(root):
    _good_image(root)
    write_image(root / "bad.png", solid(8, 8, RED))
    return root, "image", r"bad\.png: missing caption: neither bad\.txt nor bad\.json"


def empty_caption(root):
    _good_image(root)
    write_image(root / "bad.png", solid(8, 8, RED))
    (root / "bad.txt").write_text("\n  \n")
    return root, "image", r"bad\.txt: empty caption"


def caption_without_media(root):
    _good_image(root)
    (root / "bad.txt").write_text("an animation we cannot read")
    (root / "bad.gif").write_bytes(b"GIF89a")
    return root, "image", r"bad\.txt: caption without a media file"


def manifest_escaping_root(root):
    _good_image(root)
    write_image(root.parent / "outside.png", solid(8, 8, RED))
    (root / "m.jsonl").write_text(
        json.dumps({"media": "good.png", "caption": "good"}) + "\n"
        + json.dumps({"media": "../outside.png", "caption": "escape"}) + "\n"
    )
    return root / "m.jsonl", "image", r"m\.jsonl:2: path '\.\./outside\.png' escapes the dataset root"


def meta_escaping_root(root):
    _good_image(root)
    (root / "meta_data.json").write_text(json.dumps({"img_names": ["good", "../../etc/passwd"]}))
    return root, "image", r"meta_data\.json\[img_names\]\[1\]: path '\.\./\.\./etc/passwd' escapes"


def manifest_wrong_type(root):
    _good_image(root)
    (root / "m.jsonl").write_text(
        json.dumps({"media": "good.png", "caption": "good"}) + "\n"
        + json.dumps({"media": "good.png", "caption": 5}) + "\n"
    )
    return root / "m.jsonl", "image", r"m\.jsonl:2: 'caption' must be a string, got int"


def meta_wrong_type(root):
    _good_image(root)
    (root / "meta_data.json").write_text(json.dumps({"img_names": ["good", 7]}))
    return root, "image", r"meta_data\.json\[img_names\]\[1\]: expected a file name string, got int"


def cosmos_json_wrong_type(root):
    _good_image(root)
    write_image(root / "0002.png", solid(8, 8, RED))
    (root / "0002.json").write_text(json.dumps({"prompt": ["not", "a", "string"]}))
    return root, "image", r"0002\.json: 'prompt' must be a string, got list"


def zip_member_escaping(root):
    clip = write_video(root / "src" / "c.mp4", 2).read_bytes()
    with zipfile.ZipFile(root / "part.zip", "w") as archive:
        archive.writestr("ok.mp4", clip)
        archive.writestr("ok.json", json.dumps({"prompt": "good", "height": 32, "width": 48}))
        archive.writestr("../evil.mp4", clip)
        archive.writestr("../evil.json", json.dumps({"prompt": "evil"}))
    return root / "part.zip", "video", r"part\.zip:\.\./evil\.mp4: path '\.\./evil\.mp4' escapes"


CASES = [corrupt_png, truncated_png, truncated_mp4, missing_caption, empty_caption, caption_without_media,
         manifest_escaping_root, meta_escaping_root, manifest_wrong_type, meta_wrong_type, cosmos_json_wrong_type,
         zip_member_escaping]


def _build(path, modality, on_bad_sample):
    if modality == "image":
        return build_images(ImageDataParams(path=str(path), size=(8, 8)), on_bad_sample=on_bad_sample)
    return build_videos(VideoDataParams(path=str(path), size=(8, 8), num_frames=2), on_bad_sample=on_bad_sample)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_fail_raises_one_named_error(tmp_path, case):
    root = tmp_path / "data"
    root.mkdir()
    path, modality, message = case(root)
    with pytest.raises(BadSampleError, match=message):
        data = _build(path, modality, "fail")
        for index in range(len(data)):
            data[index]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_skip_keeps_the_good_sample_and_counts_the_bad_one(tmp_path, case):
    root = tmp_path / "data"
    root.mkdir()
    path, modality, message = case(root)
    data = _build(path, modality, "skip")
    items = [data[index] for index in range(len(data))]
    assert {item["prompt"] for item in items} == {"good"}
    assert len(data.policy.skipped) == 1
    assert re.search(message, str(data.policy.skipped[0]))


def test_substitution_is_deterministic_and_remembered(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for name in ("a", "c"):
        write_image(root / f"{name}.png", solid(8, 8, RED))
        (root / f"{name}.txt").write_text(name)
    write_image(root / "b.png", solid(8, 8, RED))
    (root / "b.txt").write_text("")
    data = _build(root, "image", "skip")
    assert [data[i]["prompt"] for i in range(3)] == ["a", "c", "c"]  # b → next good sample, c
    assert [data[i]["prompt"] for i in range(3)] == ["a", "c", "c"]
    assert len(data.policy.skipped) == 1  # b is not re-read and re-counted
