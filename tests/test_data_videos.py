"""Video SFT data: frame selection (stride, fps, short clips), layouts (folder, zip), tensor layout."""

from __future__ import annotations

import json
import os

import pytest
import torch
from fixtures_data import decoded_indices, write_sana_zip, write_video

from cosmos_sana_plugins.datasets.errors import BadSampleError
from cosmos_sana_plugins.datasets.media import build_videos
from cosmos_sana_plugins.datasets.params import VideoDataParams
from cosmos_sana_plugins.datasets.videos import ClipTooShort, select_frame_indices


def _videos(path, **args):
    return build_videos(VideoDataParams(path=str(path), **args))


@pytest.mark.parametrize(
    ("num_frames", "step", "available", "rule", "expected"),
    [
        (5, 2.0, None, "error", [0, 2, 4, 6, 8]),
        (4, 1.5, None, "error", [0, 1, 3, 4]),  # 24 fps → 16 fps
        (5, 3.0, 9, "pad_last", [0, 3, 6, 8, 8]),
        (5, 3.0, 9, "loop", [0, 3, 6, 0, 3]),
        (3, 1.0, 3, "error", [0, 1, 2]),  # exactly long enough
    ],
)
def test_select_frame_indices(num_frames, step, available, rule, expected):
    assert select_frame_indices(num_frames, step, available, rule) == expected


def test_select_frame_indices_short_clip_error():
    with pytest.raises(ClipTooShort, match="3 frames, needs frame index 4"):
        select_frame_indices(5, 1.0, 3, "error")


def test_folder_clip_is_3_t_h_w_with_the_asked_frames(tmp_path):
    write_video(tmp_path / "clip.mp4", num_frames=12, fps=16)
    (tmp_path / "clip.txt").write_text("a fading grey square")
    item = _videos(tmp_path, size=(16, 16), num_frames=4, stride=3)[0]
    assert item["prompt"] == "a fading grey square"
    assert item["pixels"].shape == (3, 4, 16, 16)
    assert decoded_indices(item["pixels"]) == [0, 3, 6, 9]
    assert item["pixels"].min() >= -1.0 and item["pixels"].max() <= 1.0


def test_target_fps_resamples(tmp_path):
    write_video(tmp_path / "fast.mp4", num_frames=10, fps=32)
    (tmp_path / "fast.txt").write_text("fast")
    item = _videos(tmp_path, size=(16, 16), num_frames=5, fps=16)[0]
    assert decoded_indices(item["pixels"]) == [0, 2, 4, 6, 8]


@pytest.mark.parametrize(("rule", "expected"), [("pad_last", [0, 2, 4, 5, 5]), ("loop", [0, 2, 4, 0, 2])])
def test_short_clip_rules(tmp_path, rule, expected):
    write_video(tmp_path / "short.mp4", num_frames=6)
    (tmp_path / "short.txt").write_text("short")
    item = _videos(tmp_path, size=(16, 16), num_frames=5, stride=2, short_clip=rule)[0]
    assert decoded_indices(item["pixels"]) == expected


def test_short_clip_error_names_the_file(tmp_path):
    write_video(tmp_path / "short.mp4", num_frames=6)
    (tmp_path / "short.txt").write_text("short")
    data = _videos(tmp_path, size=(16, 16), num_frames=5, stride=2)
    with pytest.raises(BadSampleError, match=r"short\.mp4: clip too short: 6 frames, needs frame index 8"):
        data[0]


def test_sana_video_zip_layout(tmp_path):
    archive = write_sana_zip(tmp_path / "part0.zip", {"k1": 4, "k0": 3})
    data = _videos(archive, size=(8, 8), num_frames=3)
    assert [item["key"] for item in data] == ["part0.zip:k0.mp4", "part0.zip:k1.mp4"]
    assert data[0]["prompt"] == "clip k0"
    assert data[0]["metadata"] == {"height": 32, "width": 48}
    assert decoded_indices(data[1]["pixels"]) == [0, 1, 2]
    assert {ref.layout for ref in data.refs} == {"zip"}


def test_cosmos_json_video_and_train_frames_default(tmp_path):
    write_video(tmp_path / "0001.mp4", num_frames=4)
    (tmp_path / "0001.json").write_text(json.dumps({"prompt": "grey ramp"}))
    config = {"policy": {"diffusers": {"inference_size": [8, 8], "train_frames": 2}}}
    item = build_videos(VideoDataParams(path=str(tmp_path)), cosmos_config=config)[0]
    assert item["pixels"].shape == (3, 2, 8, 8)
    assert torch.equal(torch.tensor(decoded_indices(item["pixels"])), torch.tensor([0, 1]))


def test_fps_and_stride_are_exclusive():
    with pytest.raises(ValueError, match="either fps or stride"):
        VideoDataParams(path="x", fps=8, stride=2)


def test_zip_index_is_read_once_per_archive_version(tmp_path, monkeypatch):
    """Reading every member must not re-parse the archive's index per sample (O(N²) an epoch)."""
    import zipfile

    from cosmos_sana_plugins.datasets import layouts

    archive = write_sana_zip(tmp_path / "part0.zip", {f"k{i}": 2 for i in range(4)})
    opened = []
    real = zipfile.ZipFile

    def counting(*args, **kwargs):
        opened.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(layouts.zipfile, "ZipFile", counting)
    data = _videos(archive, size=(8, 8), num_frames=2)
    before = len(opened)
    for _ in range(2):
        for i in range(len(data)):
            assert data[i]["pixels"].shape[1] == 2
    after = len(opened)
    assert after - before <= 1
    # a replaced archive (new mtime) is opened afresh, never read through the stale index
    os.utime(archive, ns=(1, 1))
    assert data[0]["pixels"].shape[1] == 2
    assert len(opened) == after + 1


def test_missing_pyav_is_named_before_any_sample_is_read(tmp_path, monkeypatch):
    import importlib.util

    from cosmos_sana_plugins.datasets.errors import DatasetError

    write_video(tmp_path / "clip.mp4", num_frames=3)
    (tmp_path / "clip.txt").write_text("a clip\n")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "av" else real_find_spec(name, *a))
    with pytest.raises(DatasetError, match=r"videos\(.*\): decoding needs PyAV; pip install 'cosmos-sana\[video\]'"):
        _videos(tmp_path, size=(8, 8), num_frames=3)


def test_open_archives_are_bounded(tmp_path, monkeypatch):
    from cosmos_sana_plugins.datasets import layouts

    monkeypatch.setattr(layouts, "MAX_OPEN_ARCHIVES", 1)
    first = write_sana_zip(tmp_path / "a.zip", {"k0": 2})
    second = write_sana_zip(tmp_path / "b.zip", {"k1": 2})
    layouts.read_member(first, "k0.json")
    held = next(iter(layouts._ARCHIVES.values()))
    layouts.read_member(second, "k1.json")
    assert [key[0] for key in layouts._ARCHIVES] == [str(second)]
    assert held.fp is None  # the evicted archive was closed
    assert json.loads(layouts.read_member(first, "k0.json"))["prompt"] == "clip k0"  # and reopens on demand
