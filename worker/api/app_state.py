"""What a route reaches through its app (`create_app` puts it on `app.state`), as FastAPI dependencies:
the process runtime (`runtime_of`), the API's asyncio reads (`async_reads_of`) and the event streams'
own reads and cap (`stream_reads_of`, `stream_gate_of`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from ..errors import AdmissionRefused
from ..runtime.context import Runtime
from ..store.async_reads import AsyncReads, connect_async

STREAM_RETRY_S = 5  # a stream refused for the process's cap: ask again soon


class StreamGate:
    """The event streams this API process holds open, at most `limit`. Each one holds at most one
    connection of the streams' own Redis pool at a time (that pool has `limit` connections), so streams
    never wait for a connection, and never take one that auth and the other routes need."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """A place for one more stream, or AdmissionRefused (429) when the process has `limit` open."""
        if self.open >= self.limit:
            raise AdmissionRefused(f"this API server has {self.limit} event streams open, its limit "
                                   "(REACTQ_SSE_MAX_STREAMS_PER_PROCESS); try again shortly", STREAM_RETRY_S)
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1


def attach(app: FastAPI, runtime: Runtime, no_auth_tenant: str | None) -> None:
    """Give `app` its runtime; `no_auth_tenant` (only `reactq api --insecure-no-auth`) makes every caller
    that tenant."""
    app.state.runtime = runtime
    app.state.no_auth_tenant = no_auth_tenant
    app.state.async_reads = None  # made on first use, on the serving event loop
    app.state.stream_reads = None  # likewise
    app.state.stream_gate = StreamGate(runtime.settings.sse_max_streams_per_process)


async def runtime_of(request: Request) -> Runtime:
    """The runtime of the app serving this request (async: resolved on the event loop, no thread hop)."""
    runtime: Runtime = request.app.state.runtime
    return runtime


async def async_reads_of(request: Request) -> AsyncReads:
    """The app's asyncio reads (auth checks, /healthz), on one client made on first use."""
    state = request.app.state
    if state.async_reads is None:
        s = state.runtime.settings
        state.async_reads = AsyncReads(connect_async(s.redis_url, s.redis_max_connections))
    reads: AsyncReads = state.async_reads
    return reads


def stream_reads_of(request: Request) -> AsyncReads:
    """The event streams' reads, on a client of their own with one connection per stream the process may
    hold open (made on first use, on the serving event loop)."""
    state = request.app.state
    if state.stream_reads is None:
        state.stream_reads = AsyncReads(connect_async(state.runtime.settings.redis_url, state.stream_gate.limit))
    reads: AsyncReads = state.stream_reads
    return reads


def stream_gate_of(request: Request) -> StreamGate:
    gate: StreamGate = request.app.state.stream_gate
    return gate


def no_auth_tenant_of(request: Request) -> str | None:
    """The tenant every caller acts as under `reactq api --insecure-no-auth`, else None."""
    tenant: str | None = request.app.state.no_auth_tenant
    return tenant


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
Reads = Annotated[AsyncReads, Depends(async_reads_of)]
