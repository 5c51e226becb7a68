"""``cosmos-sana score`` on real files: one JSON line per file with every component."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cosmos_sana.cli import main

PROMPT = 'a sign that says "Hello World"'


def write_png(path, tensor) -> str:
    from PIL import Image

    Image.fromarray((tensor * 255).round().byte().permute(1, 2, 0).numpy()).save(path)
    return str(path)


def write_mp4(path, frames) -> str:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = frames.shape[-1], frames.shape[-2], "yuv420p"
        for frame in frames:
            array = np.ascontiguousarray((frame * 255).round().byte().permute(1, 2, 0).numpy())
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())
    return str(path)


def test_score_images_and_a_video(render_text, tmp_path, capsys):
    import torch

    hello = write_png(tmp_path / "hello.png", render_text("Hello World"))
    bye = write_png(tmp_path / "bye.png", render_text("Goodbye Moon"))
    clip = write_mp4(tmp_path / "clip.mp4", torch.stack([render_text("Hello World")] * 5))
    code = main(["score", "--reward", "ocr=2", "--reward", "jpeg_incompressibility=0.5", "--prompt", PROMPT,
                 hello, bye, clip])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [line["file"] for line in lines] == [hello, bye, clip]
    for line in lines:
        assert set(line["scores"]) == {"ocr", "jpeg_incompressibility"} and line["prompt"] == PROMPT
        assert line["total"] == pytest.approx(2 * line["scores"]["ocr"] + 0.5 * line["scores"]["jpeg_incompressibility"])
    assert lines[0]["scores"]["ocr"] == pytest.approx(1.0)
    assert lines[1]["scores"]["ocr"] < 0.5
    assert lines[2]["scores"]["ocr"] == pytest.approx(1.0)  # frames 0 and 4 of the decoded clip


def test_score_reports_bad_input(tmp_path, capsys):
    assert main(["score", "--reward", "ocr", str(tmp_path / "missing.png")]) == 2
    assert "missing.png: no such file" in capsys.readouterr().err
    assert main(["score", "--reward", "no_such_reward", str(tmp_path / "x.png")]) == 2
    assert "unknown reward 'no_such_reward'" in capsys.readouterr().err
    assert main(["score", "--reward", "ocr", "--reward-args", "pickscore:{}", str(tmp_path / "x.png")]) == 2
    assert "--reward-args for ['pickscore']" in capsys.readouterr().err


def test_score_takes_rewards_from_a_recipe(render_text, tmp_path, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[custom]\npackage = "cosmos-sana"\n\n[[custom.rewards]]\nname = "jpeg_incompressibility"\n'
                      'weight = 2.0\nclip_max = 1.0\n')
    image = write_png(tmp_path / "hello.png", render_text("Hello World"))
    assert main(["score", "--config", str(recipe), image]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["scores"]["jpeg_incompressibility"] > 1.0  # a few KB
    assert line["total"] == pytest.approx(2.0)  # clamped to 1, weighted by 2
