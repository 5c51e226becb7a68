"""The remote scoring service: cosmos-rl's remote reward protocol over FastAPI.

``POST /api/reward/enqueue`` → ``{"uuid"}``; ``POST /api/reward/pull`` (form
``uuid``, ``type``) → ``{"uuid", "scores": {name: [...]}}`` with every reward the
request asked for, HTTP 400 ``not ready`` until scored, 404 for an unknown (or
evicted) uuid, 500 when scoring failed. ``GET /health`` lists the rewards served.
Scoring runs on the :class:`RewardScheduler`'s worker threads.
"""

# no ``from __future__ import annotations``: FastAPI reads the endpoints' annotations,
# which name classes imported inside create_app
import hmac
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


def create_app(scheduler: RewardScheduler, token: str | None, *, keep: int = 4096) -> Any:
    """The FastAPI app; ``token=None`` disables authentication (loopback use only)."""
    from fastapi import Depends, FastAPI, Form, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool

    app = FastAPI(title="cosmos-sana reward server")
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
        media = from_wire(req.array, req.media_type)
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
