"""The remote scoring service: cosmos-rl's remote reward protocol over FastAPI.

``POST /api/reward/enqueue`` → ``{"uuid"}``; ``POST /api/reward/pull`` (form
``uuid``, ``type``) → ``{"uuid", "scores": {name: [...]}}`` with every reward the
request asked for, HTTP 400 ``not ready`` until scored, 404 for an unknown (or
evicted) uuid, 500 when scoring failed. ``GET /health`` lists the rewards served.
A malformed request gets 422 with the reason; a body over ``max_body_bytes`` gets 413,
before it is read when its ``Content-Length`` says so. Scoring runs on the
:class:`RewardScheduler`'s worker threads.
"""

# no ``from __future__ import annotations``: FastAPI reads the endpoints' annotations,
# which name classes imported inside create_app
import hmac
import json
import threading
import uuid as uuidlib
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from cosmos_sana.log import get_logger
from cosmos_sana.rewards.protocol import NOT_READY, ProtocolError, decode_request, from_wire
from cosmos_sana.rewards.scheduler import RewardScheduler

logger = get_logger(__name__)

ENQUEUE_PATH = "/api/reward/enqueue"
PULL_PATH = "/api/reward/pull"
DEFAULT_MAX_BODY_MB = 1024  # a batch of 8 SANA-Video clips (81 × 480 × 832 RGB) is about 780 MB


class BodyLimit:
    """ASGI middleware answering 413 to a request body over ``limit`` bytes: at once when the
    ``Content-Length`` header declares more (nothing of the body is read), else as soon as the
    streamed body passes the limit."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    def _detail(self) -> str:
        return f"request body over the server's limit of {self.limit} bytes (reward-server --max-request-mb)"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.limit:
            await self._refuse(send)
            return
        received = 0

        async def counted() -> dict:
            from starlette.exceptions import HTTPException

            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # a chunked body with no Content-Length
                raise HTTPException(status_code=413, detail=self._detail())
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": self._detail()}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class _Results:
    """uuid → (future, requested names); keeps at most ``keep`` entries, evicting the oldest finished."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[Future, list[str]]] = OrderedDict()

    def add(self, key: str, future: Future, names: list[str]) -> None:
        with self._lock:
            self._entries[key] = (future, names)
            for old in [k for k, (f, _) in self._entries.items() if f.done()]:
                if len(self._entries) <= self.keep:
                    break
                del self._entries[old]

    def get(self, key: str) -> tuple[Future, list[str]] | None:
        with self._lock:
            return self._entries.get(key)


def create_app(
    scheduler: RewardScheduler, token: str | None, *, keep: int = 4096, max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20
) -> Any:
    """The FastAPI app; ``token=None`` disables authentication (loopback use only)."""
    from fastapi import Depends, FastAPI, Form, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool

    app = FastAPI(title="cosmos-sana reward server")
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    results = _Results(keep)

    def authorize(request: Request) -> None:
        if token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "rewards": scheduler.scorers.names, "pending": len(scheduler.pending())}

    @app.post(ENQUEUE_PATH, dependencies=[Depends(authorize)])
    async def enqueue(request: Request) -> dict[str, str]:
        body = await request.body()
        try:
            req = await run_in_threadpool(decode_request, body)
        except ProtocolError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        unknown = sorted(set(req.rewards) - set(scheduler.scorers.names))
        if unknown:
            raise HTTPException(
                status_code=422, detail=f"rewards {unknown} are not served here; served: {scheduler.scorers.names}"
            )
        key = uuidlib.uuid4().hex
        media = await run_in_threadpool(from_wire, req.array, req.media_type)  # seconds for a large batch
        names = list(req.rewards)
        try:
            future = scheduler.submit(key, [(key, i) for i in range(len(req.prompts))], media, req.prompts,
                                      rewards=names)
        except (ValueError, RuntimeError) as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        future.add_done_callback(lambda _f, k=key: _forget(scheduler, k))
        results.add(key, future, names)
        logger.info("enqueued %s: %d %s(s) for %s", key, len(req.prompts), req.media_type, names)
        return {"uuid": key}

    @app.post(PULL_PATH, dependencies=[Depends(authorize)])
    def pull(uuid: str = Form(...), type: str = Form(...)) -> dict[str, Any]:  # noqa: A002 (protocol field)
        entry = results.get(uuid)
        if entry is None:
            raise HTTPException(status_code=404, detail=f"unknown or expired uuid {uuid!r}")
        future, names = entry
        if type not in names:
            raise HTTPException(status_code=422, detail=f"reward {type!r} was not requested for {uuid}; requested {names}")
        if not future.done():
            raise HTTPException(status_code=400, detail=NOT_READY)
        error = future.exception()
        if error is not None:
            raise HTTPException(status_code=500, detail=str(error))
        return {"uuid": uuid, "scores": future.result().components}

    return app


def _forget(scheduler: RewardScheduler, key: str) -> None:
    """Drop a finished batch from the scheduler's books (the server keeps its own future)."""
    try:
        scheduler.collect(key, timeout=0)
    except Exception:  # its error stays on the future and is served by pull
        pass
