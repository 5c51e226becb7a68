"""``cosmos-sana data check``: counts, histograms, bad samples, and the exit status the policy implies."""

from __future__ import annotations

import json

import pytest
from fixtures_data import RED, halves, solid, write_image, write_video

from cosmos_sana.cli import main


@pytest.fixture
def mixed(tmp_path):
    """2 good images, 1 good 0.5 s video, a corrupt PNG, an image without caption."""
    root = tmp_path / "mixed"
    write_image(root / "wide.png", halves(32, 64, RED, RED))
    (root / "wide.txt").write_text("wide")
    write_image(root / "small.png", solid(16, 16, RED))
    (root / "small.txt").write_text("small")
    write_video(root / "clip.mp4", num_frames=8, fps=16)
    (root / "clip.txt").write_text("clip")
    (root / "broken.png").write_bytes(b"not a png")
    (root / "broken.txt").write_text("broken")
    write_image(root / "nocap.png", solid(8, 8, RED))
    return root


def test_path_report_json(mixed, capsys):
    code = main(["data", "check", str(mixed), "--size", "8", "8", "--num-frames", "4", "--json"])
    report = json.loads(capsys.readouterr().out)[0]
    assert code == 1 and report["verdict"] == "FAIL"
    assert report["counts"] == {"flat/image": 2, "flat/video": 1}
    assert report["resolutions"] == {"64x32": 1, "16x16": 1, "48x32": 1}
    assert report["durations"] == {"0-1s": 1}
    assert sorted((b["where"].rsplit("/", 1)[1], b["reason"].split(" (")[0]) for b in report["bad_samples"]) == [
        ("broken.png", "unreadable image"),
        ("nocap.png", "missing caption: neither nocap.txt nor nocap.json beside it"),
    ]


def test_skip_policy_passes_and_text_report(mixed, capsys):
    assert main(["data", "check", str(mixed), "--size", "8", "8", "--num-frames", "4", "--on-bad-sample", "skip"]) == 0
    out = capsys.readouterr().out
    assert "3 good, 2 bad (on_bad_sample=skip)" in out
    assert "flat/video: 1" in out and "verdict: a run would skip 2 sample(s)" in out


def test_short_clips_are_reported_with_the_asked_frames(mixed, capsys):
    assert main(["data", "check", str(mixed), "--size", "8", "8", "--num-frames", "9", "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)[0]["bad_samples"]
    assert any("clip.mp4" in b["where"] and "clip too short: 8 frames" in b["reason"] for b in bad)


def test_prompt_sets(capsys):
    assert main(["data", "check", "builtin:geneval"]) == 0
    assert "geneval/prompt: 6" in capsys.readouterr().out


def _recipe(tmp_path, data_table: str) -> str:
    path = tmp_path / "recipe.toml"
    path.write_text('[train]\noutput_dir = "out"\n\n[custom]\npackage = "cosmos-sana"\n\n' + data_table)
    return str(path)


def test_recipe_uses_its_own_policy_and_sizes(mixed, tmp_path, capsys):
    table = (f'[custom.data]\nname = "images"\non_bad_sample = "skip"\nargs = {{ path = "{mixed}" }}\n\n'
             '[custom.val_data]\nname = "prompts"\nargs = { path = "builtin:ocr" }\n\n'
             '[policy.diffusers]\ninference_size = [8, 8]\n\n[validation]\nenable = true\n')
    assert main(["data", "check", _recipe(tmp_path, table), "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert reports[0]["dataset"] == f"custom.data (images): {mixed}"
    assert reports[1]["dataset"].startswith("custom.val_data (prompts): ") and reports[1]["dataset"].endswith("ocr.txt")
    assert reports[0]["counts"] == {"flat/image": 2} and reports[0]["bad"] == 2 and reports[0]["verdict"] == "OK"
    assert reports[1]["counts"] == {"ocr/prompt": 8}

    failing = table.replace('on_bad_sample = "skip"', 'on_bad_sample = "fail"')
    assert main(["data", "check", _recipe(tmp_path, failing)]) == 1


def test_usage_errors(tmp_path, capsys):
    plain = tmp_path / "plain.toml"
    plain.write_text('[train]\noutput_dir = "out"\n')
    assert main(["data", "check", str(plain)]) == 2
    bad_args = _recipe(tmp_path, '[custom.data]\nname = "prompts"\nargs = { path = "builtin:demo", colour = 1 }\n')
    assert main(["data", "check", bad_args]) == 2
    assert "colour" in capsys.readouterr().err
    assert main(["data", "check", str(tmp_path / "missing")]) == 1
