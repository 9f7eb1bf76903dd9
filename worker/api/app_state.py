"""What a route reaches through its app (`create_app` puts it on `app.state`), as FastAPI dependencies:
the process runtime (`runtime_of`) and the API's asyncio reads (`async_reads_of`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Request

from ..runtime.context import Runtime
from ..store.async_reads import AsyncReads, connect_async


def attach(app: FastAPI, runtime: Runtime, no_auth_tenant: str | None) -> None:
    """Give `app` its runtime; `no_auth_tenant` (only `reactq api --insecure-no-auth`) makes every caller
    that tenant."""
    app.state.runtime = runtime
    app.state.no_auth_tenant = no_auth_tenant
    app.state.async_reads = None  # made on first use, on the serving event loop


async def runtime_of(request: Request) -> Runtime:
    """The runtime of the app serving this request (async: resolved on the event loop, no thread hop)."""
    runtime: Runtime = request.app.state.runtime
    return runtime


async def async_reads_of(request: Request) -> AsyncReads:
    """The app's asyncio reads (auth checks, event streams, /healthz), on one client made on first use."""
    state = request.app.state
    if state.async_reads is None:
        s = state.runtime.settings
        state.async_reads = AsyncReads(connect_async(s.redis_url, s.redis_max_connections))
    reads: AsyncReads = state.async_reads
    return reads


def no_auth_tenant_of(request: Request) -> str | None:
    """The tenant every caller acts as under `reactq api --insecure-no-auth`, else None."""
    tenant: str | None = request.app.state.no_auth_tenant
    return tenant


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
Reads = Annotated[AsyncReads, Depends(async_reads_of)]
