"""Who is calling the HTTP API: the tenant of the `Authorization: Bearer KEY` header.

`caller_tenant` is the FastAPI dependency every tenant-scoped route uses (401 without a key or with
an unknown one, 403 for a revoked key or one whose tenant no longer exists). Each request reads the
key's record and its tenant's from Redis, so a revocation or a removal holds at once on every API
process; an open event stream asks again on every read (`key_refusal`). `reactq api --insecure-no-auth` (loopback only)
makes every caller the first tenant of REACTQ_TENANTS: `create_app(runtime, no_auth_tenant=...)`,
deliberately not a setting, so no environment variable can turn authentication off.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer

from ..store.async_reads import AsyncReads
from ..tenancy.tenants import KeyStatus, Policy, Tenants
from .app_state import Reads, RuntimeDep, no_auth_tenant_of

__all__ = ["CallerPolicy", "CallerTenant", "bearer_scheme", "caller_policy", "caller_tenant", "key_refusal",
           "key_tenant_record"]

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
    tenant, record = await _authenticate(request, reads)
    request.state.tenant, request.state.tenant_record = tenant, record
    return tenant


async def key_refusal(request: Request, reads: AsyncReads) -> HTTPException | None:
    """None while the request's key still authorises it, else the refusal it would get now (an open event
    stream asks this on every read: a revoked key or a removed tenant ends it)."""
    if no_auth_tenant_of(request) is not None:
        return None
    recheck = getattr(request.state, "recheck_key", None)  # a UI stream: its session's key (api/ui/session.py)
    try:
        await (recheck(reads) if recheck is not None else _authenticate(request, reads))
    except HTTPException as exc:
        return exc
    return None


async def _authenticate(request: Request, reads: AsyncReads) -> tuple[str, dict[str, str]]:
    """The key's tenant and that tenant's record, read now. 401 without a key or with an unknown one, 403
    for a revoked key or a key whose tenant no longer exists (`reactq tenant remove`, or a tenant of
    REACTQ_TENANTS no longer listed there)."""
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
    if record.get("operator"):
        raise HTTPException(403, "an operator key signs in to the UI (/ui) only; the /v1 routes act for a "
                                 "tenant: use a tenant's key (reactq key create TENANT)")
    return record["tenant"], await key_tenant_record(request, reads, record["tenant"])


async def key_tenant_record(request: Request, reads: AsyncReads, tenant: str) -> dict[str, str]:
    """The record of a key's tenant, read now; 403 when that tenant no longer exists."""
    tenant_record = await reads.tenant(tenant)
    if not tenant_record and tenant not in request.app.state.runtime.settings.tenants:
        raise HTTPException(403, f"this API key's tenant {tenant!r} no longer exists; ask the operator for a "
                                 "key of an existing tenant")
    return tenant_record


CallerTenant = Annotated[str, Depends(caller_tenant)]


async def caller_policy(request: Request, tenant: CallerTenant, reads: Reads, rt: RuntimeDep) -> Policy:
    """The caller's plan and budgets, read now (a plan change applies to the next request)."""
    record = getattr(request.state, "tenant_record", None)  # read by caller_tenant just now
    policy = rt.tenants.policy_from(tenant, await reads.tenant(tenant) if record is None else record)
    if policy is None:  # a key whose tenant record is gone
        raise HTTPException(403, "this API key's tenant no longer exists")
    return policy


CallerPolicy = Annotated[Policy, Depends(caller_policy)]
