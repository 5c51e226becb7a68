"""The reward server on loopback, driven by our client and by the ``remote`` reward."""

from __future__ import annotations

import argparse

import pytest
import requests
import torch

from cosmos_sana.config import RewardRef
from cosmos_sana.plugin_manager import load_plugins
from cosmos_sana.rewards import client as client_module
from cosmos_sana.rewards.client import RemoteRewardClient, RemoteRewardError
from cosmos_sana.rewards.protocol import encode_request
from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.rewards.server import ENQUEUE_PATH, PULL_PATH, create_app

TOKEN = "s3cret-test-token"


def start(serve_app, registry, names, **options) -> tuple[str, RewardScheduler]:
    sched = RewardScheduler(ScorerSet.build([RewardRef(name=n) for n in names], registry), fail_fast=False, **options)
    return serve_app(create_app(sched, TOKEN)), sched


def client(base: str, **kw) -> RemoteRewardClient:
    return RemoteRewardClient(base + ENQUEUE_PATH, base + PULL_PATH, TOKEN, **kw)


def constant_images(levels: list[int]) -> torch.Tensor:
    """Images of constant value level/255 (exact in uint8)."""
    return torch.stack([torch.full((3, 8, 8), v / 255) for v in levels])


def test_client_waits_while_not_ready(serve_app, recording_scorers, monkeypatch):
    scorers, registry = recording_scorers
    base, _ = start(serve_app, registry, ["mean", "gated"])
    remote = client(base, poll_s=0.01)
    uuid = remote.enqueue(constant_images([51, 102]), ["a", "b"], {"mean": 1.0, "gated": 1.0})
    raw = requests.post(base + PULL_PATH, data={"uuid": uuid, "type": "mean"},
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert (raw.status_code, raw.json()) == (400, {"detail": "not ready"})

    waits = []
    real_sleep = client_module.time.sleep

    def sleep_and_release(seconds: float) -> None:  # the client only sleeps after a 'not ready'
        waits.append(seconds)
        scorers.gate.set()
        real_sleep(seconds)

    monkeypatch.setattr(client_module.time, "sleep", sleep_and_release)
    scores = remote.fetch(uuid, ["mean", "gated"])
    assert waits, "the client never saw 'not ready'"
    assert scores == {"mean": pytest.approx([0.2, 0.4]), "gated": [2.0, 2.0]}


def test_videos_travel_as_frames(serve_app, recording_scorers):
    _, registry = recording_scorers
    base, _ = start(serve_app, registry, ["mean"])
    levels = [10 * t for t in range(9)]  # frame t has value 10t/255; frames 0, 4, 8 are scored
    video = constant_images(levels).unsqueeze(0)
    assert client(base).score(video, ["a clip"], ["mean"]) == {"mean": pytest.approx([(0 + 40 + 80) / 3 / 255])}


def test_auth_and_bad_requests_are_refused_with_reasons(serve_app, recording_scorers):
    _, registry = recording_scorers
    base, _ = start(serve_app, registry, ["mean"])
    body = encode_request({"prompts": ["a"], "reward_fn": {"mean": 1}, "media_type": "image"},
                          constant_images([1]).mul(255).byte().permute(0, 2, 3, 1).numpy())
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert requests.post(base + ENQUEUE_PATH, data=body, headers=headers, timeout=10).status_code == 401
    with pytest.raises(RemoteRewardError, match=r"422.*\['pickscore'\] are not served here; served: \['mean'\]"):
        client(base).enqueue(constant_images([1]), ["a"], ["pickscore"])
    latent = encode_request({"prompts": ["a"], "reward_fn": {"mean": 1}, "media_type": "latent"},
                            torch.zeros(1, 2, 2, 3, dtype=torch.uint8).numpy())
    refused = requests.post(base + ENQUEUE_PATH, data=latent, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert refused.status_code == 422 and "send decoded frames as 'video'" in refused.text
    unknown = requests.post(base + PULL_PATH, data={"uuid": "nope", "type": "mean"},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert unknown.status_code == 404


def test_scoring_failure_reaches_the_client_and_the_server_goes_on(serve_app, recording_scorers):
    _, registry = recording_scorers
    base, _ = start(serve_app, registry, ["mean", "broken"], retries=0)
    remote = client(base, poll_s=0.01)
    with pytest.raises(RemoteRewardError, match=r"500.*reward 'broken' failed .*model exploded"):
        remote.score(constant_images([5]), ["a"], ["broken"])
    assert remote.score(constant_images([51]), ["a"], ["mean"]) == {"mean": pytest.approx([0.2])}


def test_remote_reward_plugin_scores_through_the_server(serve_app, recording_scorers, monkeypatch):
    _, registry = recording_scorers
    base, _ = start(serve_app, registry, ["mean"])
    monkeypatch.setenv("MY_REWARD_TOKEN", TOKEN)
    args = {"reward": "mean", "enqueue_url": base + ENQUEUE_PATH, "fetch_url": base + PULL_PATH,
            "token_env": "MY_REWARD_TOKEN"}
    local = ScorerSet.build([RewardRef(name="remote", args=args, weight=3.0)], registry)
    scores = local.score(constant_images([51, 153]), ["a", "b"])
    assert scores.components == {"remote": pytest.approx([0.2, 0.6])}
    assert scores.total == pytest.approx([0.6, 1.8])


def test_reward_server_command_builds_from_flags(serve_app, tmp_path, monkeypatch):
    from cosmos_sana.commands import reward_server

    parser = argparse.ArgumentParser()
    reward_server.add_arguments(parser)
    monkeypatch.delenv("REMOTE_REWARD_TOKEN", raising=False)
    with pytest.raises(ValueError, match="no bearer token"):
        reward_server.build_app(parser.parse_args(["--reward", "jpeg_incompressibility"]))
    (tmp_path / "token").write_text(TOKEN + "\n")
    app = reward_server.build_app(parser.parse_args(
        ["--reward", "jpeg_incompressibility", "--token-file", str(tmp_path / "token")]))
    base = serve_app(app)
    health = requests.get(base + "/health", timeout=10).json()
    assert health["rewards"] == ["jpeg_incompressibility"]
    flat = client(base).score(constant_images([128]), ["x"], ["jpeg_incompressibility"])["jpeg_incompressibility"]
    local = ScorerSet.build([RewardRef(name="jpeg_incompressibility")], load_plugins()).score(
        constant_images([128]), ["x"]).total
    assert flat == pytest.approx(local)
