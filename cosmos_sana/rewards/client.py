"""Client of the remote reward protocol, and the ``remote`` reward built on it.

Unlike cosmos-rl's ``RemoteRewardCalculator`` (which raises ``IndexError`` when the
first queued score is not ready), :meth:`RemoteRewardClient.fetch` waits while the
server answers HTTP 400 ``not ready``, up to ``timeout_s``. Videos travel as decoded
uint8 frames (``media_type="video"``), so no Wan VAE is needed on either side.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from cosmos_sana.config.base import StrictModel
from cosmos_sana.rewards.protocol import encode_request, load_token, to_wire

ENQUEUE_URL_ENV = "REMOTE_REWARD_ENQUEUE_URL"
FETCH_URL_ENV = "REMOTE_REWARD_FETCH_URL"
TOKEN_ENV = "REMOTE_REWARD_TOKEN"


class RemoteRewardError(RuntimeError):
    """The server refused a request or failed to score it."""


class RemoteRewardClient:
    def __init__(
        self,
        enqueue_url: str,
        fetch_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 600.0,
        poll_s: float = 0.25,
        request_timeout_s: float = 120.0,
    ) -> None:
        if not enqueue_url or not fetch_url:
            raise ValueError(f"remote reward needs both URLs (set {ENQUEUE_URL_ENV} and {FETCH_URL_ENV})")
        self.enqueue_url, self.fetch_url, self._token = enqueue_url, fetch_url, token
        self.timeout_s, self.poll_s, self.request_timeout_s = timeout_s, poll_s, request_timeout_s

    def __repr__(self) -> str:  # never shows the token
        return f"RemoteRewardClient({self.enqueue_url!r}, {self.fetch_url!r})"

    @classmethod
    def from_env(cls, **kwargs: Any) -> "RemoteRewardClient":
        """From cosmos-rl's variables ``REMOTE_REWARD_ENQUEUE_URL``/``_FETCH_URL``/``_TOKEN``."""
        return cls(os.environ.get(ENQUEUE_URL_ENV, ""), os.environ.get(FETCH_URL_ENV, ""),
                   os.environ.get(TOKEN_ENV) or None, **kwargs)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _post(self, url: str, what: str, **kwargs: Any) -> Any:
        """``requests.post``; an unreachable server or a refused token is a :class:`RemoteRewardError`
        that says what to fix (a token is never part of a message)."""
        import requests

        try:
            response = requests.post(url, headers=self._headers() | kwargs.pop("headers", {}),
                                     timeout=self.request_timeout_s, **kwargs)
        except requests.RequestException as exc:
            raise RemoteRewardError(f"{what}: cannot reach {url} ({type(exc).__name__}: {exc})") from exc
        if response.status_code in (401, 403):
            fix = (f"no token was sent: set {TOKEN_ENV} (or the reward's token_env / token_file)" if not self._token
                   else f"the token was not accepted: check {TOKEN_ENV} (or the reward's token_env / token_file)")
            raise RemoteRewardError(f"{what}: {url} refused the request (HTTP {response.status_code}); {fix}")
        return response

    def enqueue(self, media: Any, prompts: Sequence[str], rewards: Mapping[str, float] | Sequence[str]) -> str:
        """Send a float batch in [0, 1] (images or videos); returns the request's uuid."""
        array, media_type = to_wire(media)
        weights = dict(rewards) if isinstance(rewards, Mapping) else {name: 1.0 for name in rewards}
        header = {"prompts": list(prompts), "reward_fn": weights, "media_type": media_type}
        response = self._post(self.enqueue_url, "enqueue", data=encode_request(header, array),
                              headers={"Content-Type": "application/octet-stream"})
        if response.status_code != 200:
            raise RemoteRewardError(f"enqueue to {self.enqueue_url} failed: HTTP {response.status_code}: {response.text}")
        return response.json()["uuid"]

    def fetch(self, uuid: str, names: Sequence[str]) -> dict[str, list[float]]:
        """Each named reward's scores, waiting while the server says ``not ready``."""
        deadline = time.monotonic() + self.timeout_s
        scores: dict[str, list[float]] = {}
        for name in names:
            while True:
                response = self._post(self.fetch_url, f"fetching {name!r}", data={"uuid": uuid, "type": name})
                if response.status_code == 200:
                    break
                if response.status_code != 400:
                    raise RemoteRewardError(
                        f"fetching {name!r} for {uuid} failed: HTTP {response.status_code}: {response.text}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reward {name!r} for {uuid} not ready after {self.timeout_s:g} s")
                time.sleep(self.poll_s)
            payload = response.json().get("scores")
            if not isinstance(payload, dict) or name not in payload:
                raise RemoteRewardError(f"reply for {uuid} has no scores for {name!r}: {response.text[:200]}")
            scores[name] = [float(v) for v in payload[name]]
        return scores

    def score(self, media: Any, prompts: Sequence[str], names: Sequence[str]) -> dict[str, list[float]]:
        return self.fetch(self.enqueue(media, prompts, names), names)


class RemoteRewardOptions(StrictModel):
    reward: str = Field(description="the reward's name on the server")
    enqueue_url: str | None = Field(default=None, description=f"default: ${ENQUEUE_URL_ENV}")
    fetch_url: str | None = Field(default=None, description=f"default: ${FETCH_URL_ENV}")
    token_env: str = Field(default=TOKEN_ENV, description="environment variable holding the bearer token")
    token_file: str | None = Field(default=None, description="file holding the bearer token (wins over token_env)")
    timeout_s: float = Field(default=600.0, gt=0, description="how long to wait for a score")
    poll_s: float = Field(default=0.25, gt=0, description="wait between 'not ready' answers")


class RemoteReward:
    """A reward computed by a remote server: ``[[custom.rewards]] name = "remote"``."""

    def __init__(self, options: RemoteRewardOptions, device: Any) -> None:
        self.name = options.reward
        self.client = RemoteRewardClient(
            options.enqueue_url or os.environ.get(ENQUEUE_URL_ENV, ""),
            options.fetch_url or os.environ.get(FETCH_URL_ENV, ""),
            load_token(options.token_env, options.token_file),
            timeout_s=options.timeout_s,
            poll_s=options.poll_s,
        )

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        return self.client.score(media, prompts, [self.name])[self.name]
