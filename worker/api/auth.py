"""Who is calling the HTTP API: the tenant of the `Authorization: Bearer KEY` header.

`caller_tenant` is the FastAPI dependency every tenant-scoped route uses (401 without a key or with
an unknown one, 403 for a revoked key). Each request reads the key's record from Redis, so a
revocation holds at once on every API process. `reactq api --insecure-no-auth` (loopback only)
makes every caller the first tenant of REACTQ_TENANTS.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from redis import asyncio as aioredis

from ..runtime.context import get_runtime
from ..store import keys
from ..tenancy.tenants import KeyStatus, Policy, Tenants

__all__ = ["CallerPolicy", "CallerTenant", "async_redis", "caller_policy", "caller_tenant", "serve_without_keys"]

_async_redis: aioredis.Redis | None = None
_no_auth_tenant: str | None = None  # set only by `reactq api --insecure-no-auth`, never by configuration


def serve_without_keys(tenant: str) -> None:
    """`reactq api --insecure-no-auth` (which also binds to 127.0.0.1): every caller acts as `tenant`.
    Deliberately not a setting, so no environment variable can turn authentication off."""
    global _no_auth_tenant
    _no_auth_tenant = tenant


def async_redis() -> aioredis.Redis:
    """The API's asyncio Redis client (auth checks, event streams): its pool waits for a free
    connection instead of raising when all are busy."""
    global _async_redis
    if _async_redis is None:
        s = get_runtime().settings
        pool = aioredis.BlockingConnectionPool.from_url(s.redis_url, max_connections=s.redis_max_connections,
                                                        timeout=30)
        _async_redis = aioredis.Redis(connection_pool=pool)
    return _async_redis


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


async def caller_tenant(request: Request) -> str:
    """The tenant whose API key authorised this request (never a field of the body)."""
    cached = getattr(request.state, "tenant", None)
    if cached is not None:
        return str(cached)
    if _no_auth_tenant is not None:
        request.state.tenant = _no_auth_tenant
        return _no_auth_tenant
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthorized("missing API key: send the header 'Authorization: Bearer KEY'")
    key = key.strip()
    key_id = Tenants.parse_key(key)
    if key_id is None:
        raise _unauthorized("unknown API key")
    raw = await async_redis().hgetall(keys.api_key(key_id))
    record = {k.decode(): v.decode() for k, v in raw.items()}
    status = Tenants.check(key, record)
    if status == KeyStatus.UNKNOWN:
        raise _unauthorized("unknown API key")
    if status == KeyStatus.REVOKED:
        raise HTTPException(403, "this API key has been revoked")
    request.state.tenant = record["tenant"]
    return record["tenant"]


async def caller_policy(request: Request) -> Policy:
    """The caller's plan and budgets, read now (a plan change applies to the next request)."""
    tenant = await caller_tenant(request)
    raw = await async_redis().hgetall(keys.tenant(tenant))
    policy = get_runtime().tenants.policy_from(tenant, {k.decode(): v.decode() for k, v in raw.items()})
    if policy is None:  # a key whose tenant record is gone
        raise HTTPException(403, "this API key's tenant no longer exists")
    return policy


CallerTenant = Annotated[str, Depends(caller_tenant)]
CallerPolicy = Annotated[Policy, Depends(caller_policy)]
