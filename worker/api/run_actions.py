"""HTTP routes of the batch user's loop (issue 10): webhook deliveries, approvals, replay, deletion and
batch cancellation. Every route acts for the caller's tenant only; another tenant's run or batch is a 404,
like an unknown one."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field

from ..core.models import Mode
from ..core.views import run_json
from ..errors import InvalidRequest
from ..runtime.approvals import ApprovalConflict, decide
from ..runtime.context import get_runtime
from ..service.replay import replay
from ..service.retention import cancel_batch, delete_batch, delete_run
from ..tasks.steps import send_step
from .auth import caller_tenant
from .guards import owned_batch, owned_run

router = APIRouter()


class ApprovalRequest(BaseModel, extra="forbid"):
    decision: Literal["approve", "reject"]
    call_id: str | None = Field(None, max_length=200, description="the pending call; all of them when absent")
    reason: str | None = Field(None, max_length=2000, description="told to the model when rejecting")


@router.post("/v1/runs/{run_id}/approvals")
def decide_approval(run_id: str, body: ApprovalRequest, tenant: str = Depends(caller_tenant)) -> dict:
    """Approve or reject the run's call awaiting approval (409 when there is none to decide)."""
    owned_run(run_id, tenant)
    try:
        run = decide(get_runtime().store, run_id, body.call_id, body.decision == "approve", f"api:{tenant}",
                     body.reason, send_step)
    except ApprovalConflict as exc:
        raise HTTPException(409, str(exc)) from None
    return run_json(run)


@router.get("/v1/webhooks/deliveries")
def list_deliveries(tenant: str = Depends(caller_tenant), limit: int = Query(100, ge=1, le=1000),
                    before: float | None = None) -> dict:
    """The caller's webhook deliveries, newest first, each with every attempt and its status. Page with
    `before=<created_at of the last one seen>`."""
    deliveries = get_runtime().webhooks.list(tenant, limit, before)
    return {"deliveries": [d.public() for d in deliveries],
            "next_before": deliveries[-1].created_at if len(deliveries) == limit else None}


class ReplayRequest(BaseModel, extra="forbid"):
    from_step: int = Field(ge=1, description="the first step to run again, from 1 (as the trace numbers them)")
    model: str | None = Field(None, max_length=200)
    mode: Mode | None = None


@router.post("/v1/runs/{run_id}/replay", status_code=201)
def replay_run(run_id: str, body: ReplayRequest, tenant: str = Depends(caller_tenant)) -> dict:
    """A new run reusing this run's steps before `from_step` and continuing from there."""
    owned_run(run_id, tenant)
    rt = get_runtime()
    try:
        run = replay(rt.store, rt.settings, run_id, body.from_step, send_step, model=body.model, mode=body.mode)
    except InvalidRequest as exc:
        raise HTTPException(422, str(exc)) from None
    return run_json(run)


@router.delete("/v1/runs/{run_id}")
def delete_run_route(run_id: str, tenant: str = Depends(caller_tenant)) -> dict:
    """Remove the run and everything stored for it, now (an unfinished run is cancelled first)."""
    delete_run(get_runtime().store, owned_run(run_id, tenant))
    return {"deleted": run_id}


@router.post("/v1/batches/{batch_id}/cancel")
def cancel_batch_route(batch_id: str, tenant: str = Depends(caller_tenant)) -> dict:
    """Cancel every unfinished run of the batch (each stops at its next step)."""
    owned_batch(batch_id, tenant)
    return {"batch_id": batch_id, **cancel_batch(get_runtime().store, batch_id, send_step)}


@router.delete("/v1/batches/{batch_id}")
def delete_batch_route(batch_id: str, tenant: str = Depends(caller_tenant)) -> dict:
    """Remove the batch and all its runs, now."""
    owned_batch(batch_id, tenant)
    return {"deleted": batch_id, "runs": delete_batch(get_runtime().store, batch_id)}
