"""``cosmos-sana reward-server`` whose pulls wait until the batch is scored, for cosmos-rl's own client.

    python scripts/device/hold_pull_reward_server.py --reward jpeg_compressibility --port 8090 [--hold-s 8]

cosmos-rl 0.4.7's ``RemoteRewardCalculator.get_results`` raises ``IndexError`` when the oldest
queued batch answers HTTP 400 "not ready" (the remote reward protocol's answer until a batch is
scored), and its colocated loop pulls right after it enqueues, so a launch against a server that
scores in the background stops at its first step. This server asks the inner app again every few
milliseconds while it answers "not ready", for up to ``--hold-s`` seconds (below the client's 10 s
read timeout), and then passes on whatever it answered: cosmos-rl's client runs unmodified and
waits for the scores in the pull instead of in its own loop. Everything else (arguments, scorers,
authentication, protocol) is ``cosmos-sana reward-server`` unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from cosmos_sana.commands.reward_server import add_arguments, build_app
from cosmos_sana.rewards.protocol import NOT_READY
from cosmos_sana.rewards.server import PULL_PATH


class HoldPull:
    """ASGI middleware: a pull the inner app answers 400 "not ready" is asked again every ``poll_s``
    until it answers otherwise or ``hold_s`` seconds have passed; other requests pass through."""

    def __init__(self, app: Any, hold_s: float, poll_s: float = 0.005) -> None:
        self.app, self.hold_s, self.poll_s = app, hold_s, poll_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != PULL_PATH:
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_s
        while True:
            sent = await self._ask(scope, body, receive)
            if not _not_ready(sent) or loop.time() >= deadline:
                break
            await asyncio.sleep(self.poll_s)
        for message in sent:
            await send(message)

    async def _ask(self, scope: dict, body: bytes, receive: Any) -> list[dict]:
        """The inner app's response messages to the request ``body`` (later reads go to the client)."""
        delivered = False
        sent: list[dict] = []

        async def replay() -> dict:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def capture(message: dict) -> None:
            sent.append(message)

        await self.app(scope, replay, capture)
        return sent


def _not_ready(sent: list[dict]) -> bool:
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    if start is None or start["status"] != 400:
        return False
    return NOT_READY.encode() in b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--hold-s", type=float, default=8.0, help="longest wait for a batch's scores in one pull")
    args = parser.parse_args(argv)
    try:
        app = build_app(args)
    except (ValueError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(HoldPull(app, args.hold_s), host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
