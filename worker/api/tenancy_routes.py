"""HTTP routes about the caller's own tenancy: its runs (`GET /v1/runs`) and its spend (`GET /v1/usage`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from ..core.models import RunStatus
from ..core.views import run_json
from ..runtime.context import get_runtime
from ..store import run_index
from ..tenancy.budgets import usage_report
from .auth import CallerPolicy, CallerTenant
from .guards import check_id

router = APIRouter()


@router.get("/v1/runs")
def list_runs(tenant: CallerTenant, status: str | None = None, batch_id: str | None = None,
              cursor: str | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """The caller's runs, newest first; pass `next_cursor` back as `cursor` for the next page."""
    if status is not None and status not in {s.value for s in RunStatus}:
        raise HTTPException(422, f"unknown status {status!r}; statuses: {', '.join(s.value for s in RunStatus)}")
    if batch_id is not None:
        check_id(batch_id, "batch")
    rt = get_runtime()
    page = run_index.page(rt.store, tenant, status=status, batch_id=batch_id, cursor=cursor, limit=limit,
                          max_age_s=rt.settings.run_ttl_s + rt.settings.retention_s)
    return {"runs": [run_json(r) for r in page.runs], "next_cursor": page.next_cursor}


@router.get("/v1/usage")
def usage(policy: CallerPolicy) -> dict[str, Any]:
    """The caller's spend against its budgets, today and this month (reservations in flight included)."""
    return usage_report(get_runtime().redis, policy)
