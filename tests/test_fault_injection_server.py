"""Fault injection, reward server: oversized and malformed requests, and exposure without auth.

A real uvicorn server on loopback. Every malformed request must get a 4xx whose detail says what
is wrong (never a 500), an oversized one 413 before its body is read, and the server must go on
serving good requests afterwards.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import socket
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests

from cosmos_sana.config import RewardRef
from cosmos_sana.rewards.protocol import encode_request
from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.rewards.server import ENQUEUE_PATH, create_app

TOKEN = "fault-injection-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 64 * 1024


@pytest.fixture
def server(serve_app, recording_scorers) -> str:
    _, registry = recording_scorers
    scheduler = RewardScheduler(ScorerSet.build([RewardRef(name="mean")], registry), fail_fast=False)
    return serve_app(create_app(scheduler, TOKEN, max_body_bytes=LIMIT))


def images(batch: int = 1, height: int = 4, width: int = 4) -> np.ndarray:
    return np.full((batch, height, width, 3), 51, np.uint8)


def good_body() -> bytes:
    return encode_request({"prompts": ["a"], "reward_fn": {"mean": 1.0}, "media_type": "image"}, images())


def still_serves(base: str) -> None:
    reply = requests.post(base + ENQUEUE_PATH, data=good_body(), headers=AUTH, timeout=10)
    assert reply.status_code == 200 and "uuid" in reply.json()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def npy_declaring(shape: tuple, descr: str = "|u1", data: bytes = b"") -> bytes:
    """An ``.npy`` whose header declares ``shape``/``descr`` followed by ``data`` (no matter what it declares)."""
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def header(**fields) -> bytes:
    return json.dumps({"prompts": ["a"], "reward_fn": {"mean": 1.0}, "media_type": "image", **fields}).encode()


MALFORMED = {
    # case: (body, words the 422 detail must hold)
    "no newline": (b'{"prompts": []}', "JSON header, a newline"),
    "header not JSON": (b"{oops\n" + npy(images()), "header is not JSON"),
    "header not UTF-8": (b"\xff\xfe\n" + npy(images()), "header is not JSON"),
    "header a list": (b"[1, 2]\n" + npy(images()), "header must be a JSON object"),
    "weight a string": (header(reward_fn={"mean": "abc"}) + b"\n" + npy(images()), "weight of 'mean'"),
    "weight null": (header(reward_fn={"mean": None}) + b"\n" + npy(images()), "weight of 'mean'"),
    "weight NaN": (header(reward_fn={"mean": float("nan")}) + b"\n" + npy(images()), "finite number"),
    "weight infinite": (header(reward_fn={"mean": float("inf")}) + b"\n" + npy(images()), "finite number"),
    "weight boolean": (header(reward_fn={"mean": True}) + b"\n" + npy(images()), "weight of 'mean'"),
    "weights empty": (header(reward_fn={}) + b"\n" + npy(images()), "non-empty"),
    "weights a number": (header(reward_fn=3) + b"\n" + npy(images()), "non-empty"),
    "names not strings": (header(reward_fn=[1, 2]) + b"\n" + npy(images()), "list of names"),
    "npy garbage": (header() + b"\nnot an npy file at all", "not a .npy array"),
    "npy empty": (header() + b"\n", "not a .npy array"),
    "npy header truncated": (header() + b"\n" + npy(images())[:20], "not a .npy array"),
    "npy declares 1 TB": (header() + b"\n" + npy_declaring((10**6, 1000, 1000, 1), data=b"\0" * 64),
                          "but 64 bytes follow"),
    "npy declares more than sent": (header() + b"\n" + npy(images())[:-5], "bytes follow"),
    "npy trailing bytes": (header() + b"\n" + npy(images()) + b"extra", "bytes follow"),
    "npy object dtype": (header() + b"\n" + npy_declaring((1, 4, 4, 3), "|O"), "must be uint8"),
    "npy float pixels": (header() + b"\n" + npy(images().astype(np.float32)), "must be uint8"),
    "npy version 9": (header() + b"\n" + b"\x93NUMPY\x09\x00" + npy(images())[8:], "not a .npy array"),
    "0x0 image": (header() + b"\n" + npy(images(1, 0, 0)), "empty dimension"),
    "empty batch": (header(prompts=[]) + b"\n" + npy(images(0)), "empty dimension"),
    "video with 0 frames": (header(media_type="video") + b"\n" + npy(np.zeros((1, 0, 4, 4, 3), np.uint8)),
                            "empty dimension"),
    "4 channels": (header() + b"\n" + npy(np.zeros((1, 4, 4, 4), np.uint8)), "C = 1 or 3"),
    "prompt count": (header(prompts=["a", "b"]) + b"\n" + npy(images()), "2 prompts for 1 media"),
    "prompts not strings": (header(prompts=[7]) + b"\n" + npy(images()), "list of strings"),
    "video_infos a number": (header(video_infos=5) + b"\n" + npy(images()), "'video_infos' must be a list"),
    "media type audio": (header(media_type="audio") + b"\n" + npy(images()), "media_type must be"),
    "reward not served": (header(reward_fn={"pickscore": 1}) + b"\n" + npy(images()), "not served here"),
}


@pytest.mark.fault("refused")
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_gets_422_with_the_reason(server: str, case: str) -> None:
    body, words = MALFORMED[case]
    reply = requests.post(server + ENQUEUE_PATH, data=body, headers=AUTH, timeout=10)
    assert reply.status_code == 422, reply.text
    assert words in reply.json()["detail"], reply.text
    still_serves(server)


def raw_post(base: str, headers: dict[str, str], body: bytes) -> str:
    """POST by hand: the whole reply, read until the server closes the connection (5 s at most)."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        head = f"POST {ENQUEUE_PATH} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode() + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply.decode(errors="replace")


@pytest.mark.fault("refused")
@pytest.mark.parametrize("authorised", [True, False], ids=["with token", "without token"])
def test_declared_oversize_body_gets_413_before_it_is_read(server: str, authorised: bool) -> None:
    """Content-Length says 200 MB, 1 KB is sent: a server waiting for the body would time out here."""
    headers = {"Content-Length": str(200 << 20), "Content-Type": "application/octet-stream", **(AUTH if authorised else {})}
    reply = raw_post(server, headers, b"\0" * 1024)
    assert reply.startswith("HTTP/1.1 413"), reply
    assert f"limit of {LIMIT} bytes" in reply
    still_serves(server)


@pytest.mark.fault("refused")
def test_streamed_oversize_body_gets_413(server: str) -> None:
    """No Content-Length (chunked): the body is counted as it arrives and refused past the limit."""
    chunks = (b"\0" * 8192 for _ in range(4 * LIMIT // 8192))
    reply = requests.post(server + ENQUEUE_PATH, data=chunks, headers=AUTH, timeout=10)
    assert reply.status_code == 413 and "limit" in reply.json()["detail"]
    still_serves(server)


@pytest.mark.fault("refused")
def test_bad_content_length_is_refused(server: str) -> None:
    reply = raw_post(server, {"Content-Length": "-1", **AUTH}, b"")
    assert reply.startswith(("HTTP/1.1 413", "HTTP/1.1 400")), reply
    still_serves(server)


def test_body_at_the_limit_is_served(server: str) -> None:
    """Not a fault case: the largest allowed request is scored."""
    side = 100
    while len(encode_request({"prompts": ["a"], "reward_fn": {"mean": 1}}, images(1, side + 1, side + 1))) <= LIMIT:
        side += 1
    body = encode_request({"prompts": ["a"], "reward_fn": {"mean": 1}}, images(1, side, side))
    assert LIMIT - len(body) < 3 * (2 * side + 1) + 1
    assert requests.post(server + ENQUEUE_PATH, data=body, headers=AUTH, timeout=10).status_code == 200


def reward_server_args(*flags: str) -> argparse.Namespace:
    from cosmos_sana.commands import reward_server

    parser = argparse.ArgumentParser()
    reward_server.add_arguments(parser)
    return parser.parse_args(["--reward", "jpeg_incompressibility", *flags])


@pytest.mark.fault("refused")
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.org"])
def test_no_auth_on_a_public_address_needs_insecure(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmos_sana.commands import reward_server

    with pytest.raises(ValueError, match=rf"--no-auth with --host {host} .* add --insecure"):
        reward_server.build_app(reward_server_args("--host", host, "--no-auth"))


@pytest.mark.fault("contained")
def test_insecure_public_server_warns_loudly(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmos_sana.commands import reward_server
    from cosmos_sana.log import get_logger

    monkeypatch.setattr(get_logger(), "propagate", True)  # let caplog see cosmos_sana records
    with caplog.at_level(logging.WARNING):
        reward_server.build_app(reward_server_args("--host", "0.0.0.0", "--no-auth", "--insecure"))
    assert any(r.levelno == logging.WARNING and "INSECURE: no authentication on 0.0.0.0" in r.getMessage()
               for r in caplog.records)


def test_no_auth_on_loopback_is_allowed() -> None:
    """Not a fault case: local use without a token stays possible."""
    from cosmos_sana.commands import reward_server

    for host in ("127.0.0.1", "localhost", "::1"):
        reward_server.build_app(reward_server_args("--host", host, "--no-auth"))


@pytest.mark.fault("refused")
@pytest.mark.parametrize("value", ["0", "-5"])
def test_request_limit_must_be_positive(value: str) -> None:
    from cosmos_sana.commands import reward_server

    with pytest.raises(ValueError, match="--max-request-mb must be positive"):
        reward_server.build_app(reward_server_args("--no-auth", "--max-request-mb", value))


@pytest.mark.fault("refused")
def test_oversize_pull_form_gets_413(server: str) -> None:
    """The pull form is parsed before authentication: its size is capped too."""
    from cosmos_sana.rewards.server import PULL_PATH

    url = urlsplit(server)
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(f"POST {PULL_PATH} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/x-www-form-urlencoded"
                     f"\r\nContent-Length: {100 << 20}\r\n\r\nuuid=".encode())
        assert sock.recv(65536).decode(errors="replace").startswith("HTTP/1.1 413")
    still_serves(server)
