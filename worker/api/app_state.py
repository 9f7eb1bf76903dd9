"""What a route reaches through its app (`create_app` puts it on `app.state`), as FastAPI dependencies:
the process runtime (`runtime_of`) and the API's asyncio Redis client (`async_redis_of`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Request
from redis import asyncio as aioredis

from ..runtime.context import Runtime


def attach(app: FastAPI, runtime: Runtime, no_auth_tenant: str | None) -> None:
    """Give `app` its runtime; `no_auth_tenant` (only `reactq api --insecure-no-auth`) makes every caller
    that tenant."""
    app.state.runtime = runtime
    app.state.no_auth_tenant = no_auth_tenant
    app.state.async_redis = None  # made on first use, on the serving event loop


async def runtime_of(request: Request) -> Runtime:
    """The runtime of the app serving this request (async: resolved on the event loop, no thread hop)."""
    runtime: Runtime = request.app.state.runtime
    return runtime


async def async_redis_of(request: Request) -> aioredis.Redis:
    """The app's asyncio Redis client (auth checks, event streams, /healthz): its pool waits for a free
    connection instead of raising when all are busy."""
    state = request.app.state
    if state.async_redis is None:
        s = state.runtime.settings
        pool = aioredis.BlockingConnectionPool.from_url(s.redis_url, max_connections=s.redis_max_connections,
                                                        timeout=30)
        state.async_redis = aioredis.Redis(connection_pool=pool)
    client: aioredis.Redis = state.async_redis
    return client


def no_auth_tenant_of(request: Request) -> str | None:
    """The tenant every caller acts as under `reactq api --insecure-no-auth`, else None."""
    tenant: str | None = request.app.state.no_auth_tenant
    return tenant


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
AsyncRedis = Annotated[aioredis.Redis, Depends(async_redis_of)]
