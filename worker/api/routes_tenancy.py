"""HTTP routes about the caller's own tenancy: its runs (`GET /v1/runs`), its spend (`GET /v1/usage`) and
its webhook deliveries (`GET /v1/webhooks/deliveries`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from ..core.models import RunStatus
from ..core.views import run_json
from ..store import run_index
from ..tenancy.budgets import usage_report
from .app_state import RuntimeDep
from .auth import CallerPolicy, CallerTenant, caller_tenant
from .guards import check_id

router = APIRouter()


@router.get("/v1/runs")
def list_runs(tenant: CallerTenant, rt: RuntimeDep, status: str | None = None, batch_id: str | None = None,
              cursor: str | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """The caller's runs, newest first; pass `next_cursor` back as `cursor` for the next page."""
    if status is not None and status not in {s.value for s in RunStatus}:
        raise HTTPException(422, f"unknown status {status!r}; statuses: {', '.join(s.value for s in RunStatus)}")
    if batch_id is not None:
        check_id(batch_id, "batch")
    page = run_index.page(rt.store, tenant, status=status, batch_id=batch_id, cursor=cursor, limit=limit,
                          max_age_s=rt.settings.run_ttl_s + rt.settings.retention_s)
    return {"runs": [run_json(r) for r in page.runs], "next_cursor": page.next_cursor}


@router.get("/v1/usage")
def usage(policy: CallerPolicy, rt: RuntimeDep) -> dict[str, Any]:
    """The caller's spend against its budgets, today and this month (reservations in flight included)."""
    return usage_report(rt.budgets, policy)


@router.get("/v1/webhooks/deliveries")
def list_deliveries(rt: RuntimeDep, tenant: str = Depends(caller_tenant), limit: int = Query(100, ge=1, le=1000),
                    before: float | None = None) -> dict:
    """The caller's webhook deliveries, newest first, each with every attempt and its status. Page with
    `before=<created_at of the last one seen>`."""
    deliveries = rt.webhooks.list(tenant, limit, before)
    return {"deliveries": [d.public() for d in deliveries],
            "next_before": deliveries[-1].created_at if len(deliveries) == limit else None}
