"""Guards in front of the HTTP API's routes: a request body limit (413), id validation (400), ownership
(another tenant's run or batch is a 404, exactly like an unknown one), and the checked types of request
fields and parameters whose rules the OpenAPI document states as patterns (each is enforced by the same
pattern it publishes, so what a client or a fuzzer reads is what the API accepts)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import HTTPException
from pydantic import AfterValidator, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.models import Run, Text
from ..runtime.webhooks import MAX_URL_CHARS, validate_url
from ..store.runs import RunStore

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
ID_PATTERN = "^" + RUN_ID.pattern + "$"

# Not only whitespace: a character other than str.isspace()'s, which `validate_spec` strips (spelled out,
# not \s: JSON Schema's \s is ECMAScript's, another set)
_BLANK = r"\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK = re.compile(f"[^{_BLANK}]")
_PORT = "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
WEBHOOK_URL = re.compile(f"^https?://[A-Za-z0-9.-]+(?::{_PORT})?(?:[/?#][!-~]*)?$")
# a Redis stream entry id, `ms` or `ms-seq` (15 digits each stay far below Redis's 64-bit limit)
EVENT_ID = re.compile(r"^[0-9]{1,15}(?:-[0-9]{1,15})?$")
# `next_cursor` of GET /v1/runs: a finite creation time, '_', a run id
CURSOR = re.compile(r"^-?[0-9]{1,20}(?:\.[0-9]{1,20})?(?:[eE][-+]?[0-9]{1,2})?_[A-Za-z0-9-]{0,64}$")
MAX_OFFSET = 2**53 - 1  # the largest integer every JSON client reads exactly; no batch is near it


def _webhook_url(url: str) -> str:
    validate_url(url)  # its messages say what is wrong (InvalidRequest is a ValueError)
    if not WEBHOOK_URL.match(url):
        raise ValueError("webhook_url must be http(s)://HOST[:PORT][/PATH], the host letters, digits, '.' or '-', "
                         "the rest printable ASCII")
    return url


# checked by validate_spec, which reports every bad run of a batch at once ("runs[1]: the question is empty")
Question = Annotated[Text, Field(json_schema_extra={"pattern": NOT_BLANK.pattern})]
WebhookUrl = Annotated[Text, AfterValidator(_webhook_url),
                       Field(json_schema_extra={"pattern": WEBHOOK_URL.pattern, "maxLength": MAX_URL_CHARS})]


def check_cursor(cursor: str | None) -> str | None:
    if cursor is not None and not CURSOR.match(cursor):
        raise ValueError(f"invalid cursor {cursor[:80]!r}: pass the next_cursor of the previous page")
    return cursor


def check_event_id(value: str) -> str:
    """The `Last-Event-ID` header of an event stream ("0" when absent: from the start), or 422 before the
    stream opens (inside it, a bad id would only end the stream after its headers)."""
    if not EVENT_ID.match(value):
        raise HTTPException(422, f"header Last-Event-ID: {value[:80]!r} is not an event id; send the `id:` "
                                 "of the last event received (`MS` or `MS-SEQ`, digits)")
    return value


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
