"""HTTP routes of a batch: submit it, read it (a page of its run ids at a time), cancel it, delete it.
Every route acts for the caller's tenant only; another tenant's batch is a 404, like an unknown one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from pydantic import BaseModel, Field

from ..core.models import Text
from ..runtime.finish_hooks import batch_may_be_finished
from ..runtime.webhooks import validate_url
from ..service.retention import cancel_batch, delete_batch
from ..service.submit import new_batch_id, submit
from ..store.batch_view import batch_view
from ..tasks.steps import send_step, sending_together
from ..tasks.webhooks import send_delivery
from .app_state import RuntimeDep
from .auth import CallerPolicy, CallerTenant, bearer_scheme, caller_tenant
from .guards import ID_PATTERN, MAX_OFFSET, WebhookUrl, owned_batch
from .routes_runs import RunRequest, run_spec
from .schemas import AUTHED, BatchCancelled, BatchCreated, BatchDeleted, BatchView, errors, links

router = APIRouter(dependencies=[Depends(bearer_scheme)])
BatchId = Annotated[str, Path(json_schema_extra={"pattern": ID_PATTERN})]  # checked by owned_batch (400)
_BATCH = errors(*AUTHED, 400, 404)


class BatchRequest(BaseModel, extra="forbid"):
    runs: list[RunRequest] = Field(min_length=1, max_length=10_000)
    tenant: Text | None = None
    tier: Text | None = Field(None, min_length=1, description="the tier of runs that name none")
    webhook_url: WebhookUrl | None = Field(None, description="called once when the whole batch has finished")


@router.post("/v1/batches", status_code=201, response_model=BatchCreated, responses={
    **errors(*AUTHED, 400, 413, 429),
    **links(201, "batch_id", {"get": "get_batch", "cancel": "cancel_batch_route", "delete": "delete_batch_route"})})
def create_batch(body: BatchRequest, policy: CallerPolicy, rt: RuntimeDep) -> dict:
    """Every item is checked before anything is written (422 naming each bad item's index)."""
    if body.tenant is not None and body.tenant not in (policy.tenant, policy.name):
        raise HTTPException(403, f"the tenant comes from your API key; this key acts for {policy.name!r}")
    batch_id = new_batch_id()
    specs = [run_spec(r, policy, f"runs[{i}]: ", body.tier) for i, r in enumerate(body.runs)]
    meta = {"size": str(len(specs)), "tenant": policy.tenant}
    if body.webhook_url is not None:
        meta["webhook_url"] = validate_url(body.webhook_url)
    rt.store.batches.create(batch_id, {**meta, "submitting": "1"})  # first: a run may end before submit returns
    try:
        with sending_together() as send:
            runs = submit(rt.store, specs, rt.settings, send, batch_id=batch_id, tenants=rt.fresh_tenants(),
                          budgets=rt.budgets)
    except Exception:
        rt.store.batches.drop_record(batch_id)
        raise
    rt.store.batches.mark_submitted(batch_id, len(runs))
    batch_may_be_finished(rt, batch_id, send_delivery, policy.tenant)
    return {"batch_id": batch_id, "run_ids": [r.id for r in runs]}


@router.get("/v1/batches/{batch_id}", response_model=BatchView, responses=_BATCH)
def get_batch(batch_id: BatchId, tenant: CallerTenant, rt: RuntimeDep,
              offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> dict:
    """The batch's figures and a page of its run ids (`next_offset` is the next page's, null at the end)."""
    store = rt.store
    owned_batch(store, batch_id, tenant)
    view = batch_view(store, batch_id)
    if view is None:
        raise HTTPException(404, f"no batch {batch_id!r}")
    run_ids = store.batches.run_ids_page(batch_id, offset, limit)
    more = offset + len(run_ids) < view["size"]
    return {**view, "run_ids": run_ids, "next_offset": offset + len(run_ids) if more else None}


@router.post("/v1/batches/{batch_id}/cancel", response_model=BatchCancelled, responses=_BATCH)
def cancel_batch_route(batch_id: BatchId, rt: RuntimeDep, tenant: str = Depends(caller_tenant)) -> dict:
    """Cancel every unfinished run of the batch (each stops at its next step)."""
    owned_batch(rt.store, batch_id, tenant)
    return {"batch_id": batch_id, **cancel_batch(rt.store, batch_id, send_step)}


@router.delete("/v1/batches/{batch_id}", response_model=BatchDeleted, responses=_BATCH)
def delete_batch_route(batch_id: BatchId, rt: RuntimeDep, tenant: str = Depends(caller_tenant)) -> dict:
    """Remove the batch and all its runs, now."""
    owned_batch(rt.store, batch_id, tenant)
    return {"deleted": batch_id, "runs": delete_batch(rt.store, batch_id)}
