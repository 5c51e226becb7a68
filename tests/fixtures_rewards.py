"""Reward fixtures: tiny scorer weights, rendered text, recording test scorers, a loopback server."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cosmos_sana.hookspecs import hookimpl


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ``CLIPModel`` folder (32² images, logit scale e³) with tokenizer and image processor."""
    from cosmos_sana_plugins.rewards.tiny import tiny_clip

    return tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="session")
def tiny_hps(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(open_clip arch name, HPS-format checkpoint) of a tiny ViT CLIP."""
    from cosmos_sana_plugins.rewards.tiny import tiny_hps as build

    return build(tmp_path_factory.mktemp("tiny_hps"))


@pytest.fixture(scope="session")
def tiny_image_reward(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny ``ImageReward.pt`` (upstream key names), ``med_config.json``, BERT tokenizer, raw state."""
    from cosmos_sana_plugins.rewards.tiny import tiny_image_reward as build

    return build(tmp_path_factory.mktemp("tiny_image_reward"))


@pytest.fixture(scope="session")
def render_text():
    """``render_text(text) -> 3×96×W float tensor``: black 48 px text on white, in Debian's DejaVu Sans
    (found with ``fc-match``), or Pillow's bundled TrueType font where fontconfig is not installed."""
    import shutil

    import numpy as np
    import torch
    from PIL import Image, ImageDraw, ImageFont

    if shutil.which("fc-match"):
        font_file = subprocess.run(
            ["fc-match", "-f", "%{file}", "DejaVuSans"], capture_output=True, text=True, check=True
        ).stdout.strip()
        font = ImageFont.truetype(font_file, 48)
    else:
        font = ImageFont.load_default(size=48)

    def render(text: str, width: int = 416) -> Any:
        image = Image.new("RGB", (width, 96), "white")
        if text:
            ImageDraw.Draw(image).text((16, 18), text, fill="black", font=font)
        return torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255

    return render


class RecordingScorers:
    """Test scorers that log every (scorer, sample) they score.

    ``mean``: the sample's mean pixel (sleeps ``metadata["delay"]`` first);
    ``flaky``: like ``mean`` but fails its first ``flaky_failures`` calls;
    ``broken``: always raises; ``gated``: waits for ``gate`` (the 'hung' scorer).
    Samples are identified by ``metadata["sid"]``.
    """

    def __init__(self) -> None:
        import collections
        import threading

        self.calls: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.flaky_failures = 1

    def _log(self, name: str, metadata: list[dict]) -> None:
        with self.lock:
            self.calls.update((name, m.get("sid")) for m in metadata)

    def mean(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        import time

        self._log("mean", metadata)
        time.sleep(metadata[0].get("delay", 0.0))
        return media.flatten(1).mean(dim=1).tolist()

    def flaky(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        self._log("flaky", metadata)
        with self.lock:
            self.flaky_failures -= 1
            if self.flaky_failures >= 0:
                raise ConnectionError("scoring backend hiccup")
        return media.flatten(1).mean(dim=1).tolist()

    def broken(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        self._log("broken", metadata)
        raise RuntimeError("model exploded")

    def gated(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        self._log("gated", metadata)
        self.gate.wait()
        return [2.0] * media.shape[0]

    def nan(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        return [float("nan")] * media.shape[0]

    @hookimpl
    def cosmos_sana_rewards(self) -> list[Any]:
        from cosmos_sana.specs import RewardSpec

        names = ("mean", "flaky", "broken", "gated", "nan")
        return [RewardSpec(name=n, target=getattr(self, n), modality="image") for n in names]


@pytest.fixture
def recording_scorers() -> Any:
    """(scorers, registry): the installed plugins plus :class:`RecordingScorers`."""
    from cosmos_sana.plugin_manager import load_plugins

    scorers = RecordingScorers()
    yield scorers, load_plugins(extra=[scorers])
    scorers.gate.set()  # release any thread still waiting


@pytest.fixture
def serve_app():
    """``serve_app(app) -> base URL``: runs a FastAPI app with uvicorn on a free loopback port."""
    import socket
    import threading
    import time

    import uvicorn

    running: list[tuple[Any, Any]] = []

    def serve(app: Any) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((server, thread))
        for _ in range(500):
            if server.started:
                break
            time.sleep(0.01)
        assert server.started, "uvicorn did not start"
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield serve
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=10)
