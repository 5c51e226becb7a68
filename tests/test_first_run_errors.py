"""First-run mistakes end in one error line naming the file or setting, not a traceback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cosmos_sana.cli import main

TOKEN = "tok-never-printed-42"


@pytest.fixture
def binary_recipe(tmp_path: Path) -> Path:
    path = tmp_path / "model.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    return path


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "x.png"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(path)
    return path


@pytest.mark.parametrize("command", [["validate"], ["data", "check"]])
def test_a_binary_file_as_recipe_is_named(command, binary_recipe, capsys):
    assert main([*command, str(binary_recipe)]) in (1, 2)
    err = capsys.readouterr().err
    assert f"{binary_recipe}: <file>: not a text file (byte 0 is not UTF-8)" in err and "Traceback" not in err


def test_a_folder_as_recipe_is_named(tmp_path, capsys):
    assert main(["validate", str(tmp_path)]) == 1
    assert f"{tmp_path}: <file>: is a folder" in capsys.readouterr().err


def test_validate_dump_to_a_missing_folder_is_named(tmp_path, capsys):
    recipe = Path(__file__).resolve().parents[1] / "toml" / "tiny" / "sana-image-nft.toml"
    target = tmp_path / "no-such-folder" / "resolved.toml"
    assert main(["validate", str(recipe), "--no-path-check", "--dump", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"error: --dump {target}: No such file or directory" in err and "Traceback" not in err


def test_score_config_that_is_binary_is_named(binary_recipe, image, capsys):
    assert main(["score", str(image), "--config", str(binary_recipe)]) == 2
    assert f"--config {binary_recipe}: <file>: not a text file" in capsys.readouterr().err


def test_ocr_score_without_a_prompt_says_so(image, capsys):
    assert main(["score", str(image), "--reward", "ocr"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {image}: ") and "target text in double quotes" in err
    assert "give the prompt with --prompt" in err


class _Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"detail": "missing or wrong bearer token"}')

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def refusing_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_remote_reward_401_says_what_to_set(refusing_server, image, capsys, monkeypatch):
    args = {"reward": "mean", "enqueue_url": refusing_server + "/enqueue", "fetch_url": refusing_server + "/pull"}
    monkeypatch.delenv("REMOTE_REWARD_TOKEN", raising=False)
    assert main(["score", str(image), "--reward", "remote", "--reward-args", f"remote:{json.dumps(args)}"]) == 2
    err = capsys.readouterr().err
    assert f"enqueue: {refusing_server}/enqueue refused the request (HTTP 401); no token was sent: set " \
           "REMOTE_REWARD_TOKEN" in err and "Traceback" not in err

    monkeypatch.setenv("REMOTE_REWARD_TOKEN", TOKEN)
    assert main(["score", str(image), "--reward", "remote", "--reward-args", f"remote:{json.dumps(args)}"]) == 2
    err = capsys.readouterr().err
    assert "the token was not accepted: check REMOTE_REWARD_TOKEN" in err and TOKEN not in err


def test_unreachable_reward_server_is_named():
    import torch

    from cosmos_sana.rewards.client import RemoteRewardClient, RemoteRewardError

    client = RemoteRewardClient("http://127.0.0.1:9/enqueue", "http://127.0.0.1:9/pull", request_timeout_s=5)
    with pytest.raises(RemoteRewardError, match=r"enqueue: cannot reach http://127.0.0.1:9/enqueue \(ConnectionError"):
        client.enqueue(torch.zeros(1, 3, 4, 4), ["a"], ["mean"])


def test_a_text_file_given_as_pth(tmp_path, tiny_image_pipeline_dir, capsys):
    fake = tmp_path / "model.pth"
    fake.write_text("this is a README, not weights\n")
    code = main(["convert-to-dcp", str(fake), "--base", str(tiny_image_pipeline_dir), "--out", str(tmp_path / "dcp")])
    err = capsys.readouterr().err
    assert code == 1 and f"{fake}: not a torch checkpoint (starts with b'this'" in err and "Traceback" not in err


def test_a_truncated_dcp_shard_is_named(tmp_path, tiny_image_pipeline_dir):
    from cosmos_sana.checkpoint import CheckpointError, convert_to_dcp
    from cosmos_sana.checkpoint.dcp_io import load_state, read_metadata

    out = Path(convert_to_dcp(str(tiny_image_pipeline_dir), tmp_path / "dcp"))
    model = out / "model"
    meta = read_metadata(model)
    state = {k: torch_empty(v) for k, v in meta.state_dict_metadata.items()}
    load_state(state, model)  # whole: loads
    (shard,) = sorted(model.glob("*.distcp"))
    full = shard.stat().st_size
    with shard.open("r+b") as handle:
        handle.truncate(full // 2)
    with pytest.raises(CheckpointError) as info:
        load_state(state, model)
    assert str(info.value).startswith(f"{shard}: cannot load: truncated to {full // 2} bytes")


def torch_empty(meta):
    import torch

    return torch.empty(meta.size, dtype=meta.properties.dtype)


def test_a_dcp_error_without_message_still_says_what_happened():
    from cosmos_sana.checkpoint.dcp_io import _reason

    assert _reason(EOFError()) == "EOFError"
    assert _reason(ValueError("bad")) == "ValueError: bad"
