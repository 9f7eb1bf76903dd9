"""Guards in front of the HTTP API's routes: a request body limit (413), id validation (400) and
ownership (another tenant's run or batch is a 404, exactly like an unknown one)."""

from __future__ import annotations

import re

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.models import Run
from ..store.runs import RunStore

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_id(value: str, what: str = "run") -> str:
    """A run or batch id as the URL gave it, or 400: ids are letters, digits, '-' and '_' (never ':',
    which would reach another Redis key of the run)."""
    if not RUN_ID.fullmatch(value):
        raise HTTPException(400, f"malformed {what} id: ids are 1-64 letters, digits, '-' or '_'")
    return value


def owned_run(store: RunStore, run_id: str, tenant: str) -> Run:
    """The caller's run, or 404, exactly as for an unknown id (400 for a malformed id)."""
    run = store.load_run(check_id(run_id))
    if run is None or run.spec.tenant != tenant:
        raise HTTPException(404, f"no run {run_id!r}")
    return run


def owned_batch(store: RunStore, batch_id: str, tenant: str) -> None:
    """404 unless the batch exists and is the caller's (400 for a malformed id)."""
    info = store.batches.info(check_id(batch_id, "batch"))
    if not info or info.get("tenant") != tenant:
        raise HTTPException(404, f"no batch {batch_id!r}")


class BodyLimit:
    """ASGI middleware: a request whose body is larger than `max_bytes` answers 413 before any route
    reads it (declared by Content-Length, or counted as a chunked body arrives)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        chunks: list[Message] = []
        size = 0
        more = True
        while more:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(send)
                return
            more = message.get("more_body", False)

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body = (b'{"error": {"message": "request body larger than %d bytes", "status": 413}}' % self.max_bytes)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
