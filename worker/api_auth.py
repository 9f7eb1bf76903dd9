"""Who is calling the HTTP API. PLACEHOLDER until issue 8's real module lands (API keys, `Authorization:
Bearer KEY`): every caller is the first tenant of REACTQ_TENANTS. Routes depend on `caller_tenant` only,
so the real one replaces this file without touching them."""

from __future__ import annotations

from fastapi import Request

from .runtime import get_runtime

__all__ = ["caller_tenant"]


async def caller_tenant(request: Request) -> str:
    """The tenant of this request."""
    return get_runtime().settings.tenants[0]
