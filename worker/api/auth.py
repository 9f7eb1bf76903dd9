"""Who is calling the HTTP API: the tenant of the `Authorization: Bearer KEY` header.

`caller_tenant` is the FastAPI dependency every tenant-scoped route uses (401 without a key or with
an unknown one, 403 for a revoked key). Each request reads the key's record from Redis, so a
revocation holds at once on every API process. `reactq api --insecure-no-auth` (loopback only)
makes every caller the first tenant of REACTQ_TENANTS: `create_app(runtime, no_auth_tenant=...)`,
deliberately not a setting, so no environment variable can turn authentication off.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer

from ..tenancy.tenants import KeyStatus, Policy, Tenants
from .app_state import Reads, RuntimeDep, no_auth_tenant_of

__all__ = ["CallerPolicy", "CallerTenant", "bearer_scheme", "caller_policy", "caller_tenant"]

# The scheme as OpenAPI states it (a router's dependency); `caller_tenant` does the checking.
bearer_scheme = HTTPBearer(auto_error=False, description="an API key: `reactq key create TENANT`")


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


async def caller_tenant(request: Request, reads: Reads) -> str:
    """The tenant whose API key authorised this request (never a field of the body)."""
    cached = getattr(request.state, "tenant", None)
    if cached is not None:
        return str(cached)
    no_auth_tenant = no_auth_tenant_of(request)
    if no_auth_tenant is not None:
        request.state.tenant = no_auth_tenant
        return no_auth_tenant
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthorized("missing API key: send the header 'Authorization: Bearer KEY'")
    key = key.strip()
    key_id = Tenants.parse_key(key)
    if key_id is None:
        raise _unauthorized("unknown API key")
    record = await reads.api_key(key_id)
    status = Tenants.check(key, record)
    if status == KeyStatus.UNKNOWN:
        raise _unauthorized("unknown API key")
    if status == KeyStatus.REVOKED:
        raise HTTPException(403, "this API key has been revoked")
    request.state.tenant = record["tenant"]
    return record["tenant"]


CallerTenant = Annotated[str, Depends(caller_tenant)]


async def caller_policy(tenant: CallerTenant, reads: Reads, rt: RuntimeDep) -> Policy:
    """The caller's plan and budgets, read now (a plan change applies to the next request)."""
    policy = rt.tenants.policy_from(tenant, await reads.tenant(tenant))
    if policy is None:  # a key whose tenant record is gone
        raise HTTPException(403, "this API key's tenant no longer exists")
    return policy


CallerPolicy = Annotated[Policy, Depends(caller_policy)]
