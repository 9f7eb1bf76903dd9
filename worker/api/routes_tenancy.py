"""HTTP routes about the caller's own tenancy: its runs (`GET /v1/runs`), its spend (`GET /v1/usage`) and
its webhook deliveries (`GET /v1/webhooks/deliveries`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import AfterValidator

from ..core.models import RunStatus
from ..core.views import run_json
from ..store import run_index
from ..tenancy.budgets import usage_report
from .app_state import RuntimeDep
from .auth import CallerPolicy, CallerTenant, bearer_scheme, caller_tenant
from .guards import CURSOR, ID_PATTERN, check_cursor, check_id
from .schemas import AUTHED, DeliveryPage, RunPage, UsageReport, errors

router = APIRouter(dependencies=[Depends(bearer_scheme)])


@router.get("/v1/runs", response_model=RunPage, responses=errors(*AUTHED, 400))
def list_runs(tenant: CallerTenant, rt: RuntimeDep,
              status: Annotated[str | None, Query(json_schema_extra={"enum": [s.value for s in RunStatus]})] = None,
              batch_id: Annotated[str | None, Query(json_schema_extra={"pattern": ID_PATTERN})] = None,
              cursor: Annotated[str | None, AfterValidator(check_cursor), Query(
                  json_schema_extra={"pattern": CURSOR.pattern}, description="`next_cursor` of the last page")] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """The caller's runs, newest first; pass `next_cursor` back as `cursor` for the next page."""
    if status is not None and status not in {s.value for s in RunStatus}:
        raise HTTPException(422, f"unknown status {status!r}; statuses: {', '.join(s.value for s in RunStatus)}")
    if batch_id is not None:
        check_id(batch_id, "batch")
    page = run_index.page(rt.store, tenant, status=status, batch_id=batch_id, cursor=cursor, limit=limit,
                          max_age_s=rt.settings.run_ttl_s + rt.settings.retention_s)
    return {"runs": [run_json(r) for r in page.runs], "next_cursor": page.next_cursor}


@router.get("/v1/usage", response_model=UsageReport, responses=errors(401, 403, 503))
def usage(policy: CallerPolicy, rt: RuntimeDep) -> dict[str, Any]:
    """The caller's spend against its budgets, today and this month (reservations in flight included)."""
    return usage_report(rt.budgets, policy)


@router.get("/v1/webhooks/deliveries", response_model=DeliveryPage, responses=errors(*AUTHED))
def list_deliveries(rt: RuntimeDep, tenant: str = Depends(caller_tenant), limit: int = Query(100, ge=1, le=1000),
                    before: Annotated[float | None, Query(allow_inf_nan=False)] = None) -> dict:
    """The caller's webhook deliveries, newest first, each with every attempt and its status. Page with
    `before=<created_at of the last one seen>`."""
    deliveries = rt.webhooks.list(tenant, limit, before)
    return {"deliveries": [d.public() for d in deliveries],
            "next_before": deliveries[-1].created_at if len(deliveries) == limit else None}
