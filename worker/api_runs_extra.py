"""HTTP routes of the batch user's loop (issue 10): webhook deliveries, approvals, replay, deletion and
batch cancellation. Every route acts for the caller's tenant only; another tenant's run or batch is a 404,
like an unknown one."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from .api_auth import caller_tenant
from .finish_hooks import webhook_store
from .runtime import get_runtime

router = APIRouter()


@router.get("/v1/webhooks/deliveries")
def list_deliveries(tenant: str = Depends(caller_tenant), limit: int = Query(100, ge=1, le=1000),
                    before: float | None = None) -> dict:
    """The caller's webhook deliveries, newest first, each with every attempt and its status. Page with
    `before=<created_at of the last one seen>`."""
    deliveries = webhook_store(get_runtime()).list(tenant, limit, before)
    return {"deliveries": [d.public() for d in deliveries],
            "next_before": deliveries[-1].created_at if len(deliveries) == limit else None}
