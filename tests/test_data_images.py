"""Image SFT data in every layout: exact tensors, captions, order."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures_data import BLUE, GREEN, RED, WHITE, halves, pixel, solid, write_image

from cosmos_sana_plugins.datasets.errors import DatasetError
from cosmos_sana_plugins.datasets.media import build_images
from cosmos_sana_plugins.datasets.params import ImageDataParams


def _images(path, **args):
    return build_images(ImageDataParams(path=str(path), **args))


def test_flat_folder_items_are_exact_center_crops(image_folder):
    data = _images(image_folder, size=(32, 32))
    assert [item["key"] for item in data] == ["a.png", "b.webp", "sub/c.jpg"]
    first = data[0]
    assert first["prompt"] == "a red and blue card"
    assert first["pixels"].shape == (3, 32, 32) and first["pixels"].dtype == torch.float32
    # 64 wide → centre 32 columns: 16 red then 16 blue, values v/127.5 - 1
    assert torch.equal(first["pixels"][:, :, :16], pixel(RED)[:, None, None].expand(3, 32, 16))
    assert torch.equal(first["pixels"][:, :, 16:], pixel(BLUE)[:, None, None].expand(3, 32, 16))
    assert torch.equal(data[1]["pixels"], pixel(GREEN)[:, None, None].expand(3, 32, 32))
    grey = data[2]["pixels"]  # JPEG of a flat grey: within 1 level of 128
    assert grey.min() >= 127 / 127.5 - 1 and grey.max() <= 129 / 127.5 - 1
    assert data.decode_count == 6  # no caching: 3 for the listing + 3 indexed reads


def test_resize_covers_then_crops(tmp_path):
    quad = solid(64, 64, WHITE)
    quad[:32, :32], quad[:32, 32:], quad[32:, :32] = RED, GREEN, BLUE
    write_image(tmp_path / "q.png", quad)
    (tmp_path / "q.txt").write_text("quadrants")
    pixels = _images(tmp_path, size=(32, 16))[0]["pixels"]
    assert pixels.shape == (3, 32, 16)
    # 64² → 32² (cover), then the centre 16 columns: rows 0-15 straddle red|green, rows 16-31 blue|white
    assert torch.equal(pixels[:, 4, 2], pixel(RED)) and torch.equal(pixels[:, 4, 13], pixel(GREEN))
    assert torch.equal(pixels[:, 27, 2], pixel(BLUE)) and torch.equal(pixels[:, 27, 13], pixel(WHITE))


def test_size_defaults_to_policy_inference_size(image_folder):
    config = {"policy": {"diffusers": {"inference_size": [16, 24]}}}
    data = build_images(ImageDataParams(path=str(image_folder)), cosmos_config=config)
    assert data[0]["pixels"].shape == (3, 16, 24)
    with pytest.raises(DatasetError, match="args.size"):
        build_images(ImageDataParams(path=str(image_folder)))


def test_sana_meta_data_json_lists_and_orders_samples(tmp_path):
    for name, colour in (("x", RED), ("y", BLUE), ("z", GREEN)):
        write_image(tmp_path / f"{name}.png", solid(8, 8, colour))
        (tmp_path / f"{name}.txt").write_text(f"caption {name}")
    (tmp_path / "meta_data.json").write_text(json.dumps({"name": "toy", "img_names": ["z", "x.png"]}))
    data = _images(tmp_path, size=(8, 8))
    assert len(data) == 2  # y is not listed
    assert [data[i]["prompt"] for i in range(2)] == ["caption z", "caption x"]
    assert torch.equal(data[0]["pixels"][:, 0, 0], pixel(GREEN))
    assert {ref.layout for ref in data.refs} == {"sana_meta"}


def test_cosmos_json_sidecars_keep_extra_fields(tmp_path):
    write_image(tmp_path / "0001.jpg", solid(8, 8, WHITE))
    (tmp_path / "0001.json").write_text(json.dumps({"prompt": "  white square ", "source": "synthetic"}))
    item = _images(tmp_path, size=(8, 8))[0]
    assert item["prompt"] == "white square"
    assert item["metadata"] == {"source": "synthetic"}
    assert _images(tmp_path, size=(8, 8)).refs[0].layout == "cosmos"


def test_jsonl_manifest_paths_are_relative_to_the_manifest(tmp_path):
    write_image(tmp_path / "media" / "one.png", halves(8, 8, RED, BLUE))
    write_image(tmp_path / "media" / "two.png", solid(8, 8, BLUE))
    manifest = tmp_path / "train.jsonl"
    manifest.write_text(
        json.dumps({"media": "media/two.png", "caption": "blue", "score": 0.5}) + "\n\n"
        + json.dumps({"media": "media/one.png", "caption": "split"}) + "\n"
    )
    data = _images(manifest, size=(8, 8))
    assert [item["prompt"] for item in data] == ["blue", "split"]  # manifest order
    assert data[0]["metadata"] == {"score": 0.5}
    assert torch.equal(data[1]["pixels"][:, 0, 0], pixel(RED)) and torch.equal(data[1]["pixels"][:, 0, 7], pixel(BLUE))


def test_bucket_mode_uses_diffusers_aspect_ratio_bins(tmp_path):
    write_image(tmp_path / "wide.png", solid(128, 256, RED))  # h/w = 0.5 → 256 bin "0.5": [176, 352]
    (tmp_path / "wide.txt").write_text("wide")
    write_image(tmp_path / "square.png", solid(64, 64, BLUE))  # 1.0 → [256, 256]
    (tmp_path / "square.txt").write_text("square")
    data = _images(tmp_path, size=(256, 256), resize="bucket")
    assert data.bucket_keys() == [(256, 256), (176, 352)]
    assert data[1]["pixels"].shape == (3, 176, 352)
    assert torch.equal(data[1]["pixels"][:, 100, 100], pixel(RED))
    with pytest.raises(DatasetError, match="no aspect-ratio bins for size 300"):
        _images(tmp_path, size=(300, 300), resize="bucket")
