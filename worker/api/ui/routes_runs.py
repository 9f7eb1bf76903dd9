"""The runs pages: the list (`/ui/runs`, its live counts), one run (`/ui/runs/{id}`, its live fragment and
its event stream), and the forms that act on a run (approve or reject, cancel, replay). They reuse what the
JSON API uses: the run index's pages, `owned`-style checks (another tenant's run is the 404 page), the
event stream's code, `record_decision`, `cancel` and `replay`. An operator key sees every tenant's runs
and acts on none (the forms are a tenant's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Header, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from ...core.models import Run, RunStatus
from ...errors import AdmissionRefused, ApprovalConflict, InvalidRequest, TierNotAllowed
from ...runtime.approvals import record_decision
from ...service.replay import replay
from ...service.submit import cancel, known_models
from ...tasks.steps import send_step
from ..app_state import Reads, RuntimeDep
from ..guards import RUN_ID, check_cursor
from ..routes_runs import EventStream, open_event_stream, run_events
from . import listing, views
from .render import error_page, not_found, render
from .session import CsrfChecked, UiCaller, UiPrincipal

router = APIRouter()
Text200 = Annotated[str, Query(max_length=200)]


def _filters(caller: UiPrincipal, status: str | None, batch_id: str | None, model: str | None,
             since: str | None, until: str | None, tenant: str | None) -> listing.Filters:
    return listing.Filters(status=listing.check_status(status), batch_id=batch_id or None, model=model or None,
                           since=listing.parse_time(since, "since"), until=listing.parse_time(until, "until"),
                           tenant=(tenant or None) if caller.is_operator else None)


@router.get("/runs")
def runs_page(request: Request, caller: UiCaller, rt: RuntimeDep, status: Text200 = "", batch_id: Text200 = "",
              model: Text200 = "", since: Text200 = "", until: Text200 = "", tenant: Text200 = "",
              cursor: Text200 = "", limit: Annotated[int, Query(ge=1, le=200)] = listing.PAGE_SIZE) -> Response:
    try:
        filters = _filters(caller, status, batch_id, model, since, until, tenant)
        page = listing.page(rt, caller.tenant, filters, check_cursor(cursor) if cursor else None, limit)
    except ValueError as exc:  # InvalidRequest is one
        return error_page(request, 400, str(exc))
    return render(request, "runs.html", nav_active="runs", runs=page.runs, next_cursor=page.next_cursor,
                  filters=filters, query=filters.query(), limit=limit, statuses=[s.value for s in RunStatus],
                  models=known_models(rt.settings), tenants=rt.tenants.ids() if caller.is_operator else [],
                  counts=_counts(rt, caller, filters))


def _counts(rt: RuntimeDep, caller: UiPrincipal, filters: listing.Filters) -> dict[str, object]:
    tally, capped = listing.counts(rt, caller.tenant, filters)
    return {"tally": tally, "capped": capped, "scan": listing.COUNT_SCAN}


@router.get("/runs/counts")
def runs_counts(request: Request, caller: UiCaller, rt: RuntimeDep, batch_id: Text200 = "", model: Text200 = "",
                since: Text200 = "", until: Text200 = "", tenant: Text200 = "", status: Text200 = "") -> Response:
    """The live counts fragment (the runs page asks again every few seconds)."""
    try:
        filters = _filters(caller, status, batch_id, model, since, until, tenant)
    except InvalidRequest as exc:
        return error_page(request, 400, str(exc))
    return render(request, "_counts.html", counts=_counts(rt, caller, filters), query=filters.query())


def _visible(rt: RuntimeDep, caller: UiPrincipal, run_id: str) -> Run | None:
    """The run, if it exists and the caller may see it (else None: the 404 page, whichever it was)."""
    if not RUN_ID.fullmatch(run_id):
        return None
    run = rt.store.load_run(run_id)
    return run if run is not None and caller.can_see(run.spec.tenant) else None


def _shown(request: Request, rt: RuntimeDep, caller: UiPrincipal, run_id: str, template: str) -> Response:
    """A run in `template` (the page, or its live part), or the 404 page."""
    run = _visible(rt, caller, run_id)
    if run is None:
        return not_found(request, f"run {run_id}")
    steps = rt.store.load_steps(run.id)
    return render(request, template, nav_active="runs", run=run, steps=views.steps_of(run, steps),
                  timings=views.timings(run, steps), pending=[a for a in run.approvals if a.decision is None],
                  may_act=not caller.is_operator)


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: str, caller: UiCaller, rt: RuntimeDep) -> Response:
    return _shown(request, rt, caller, run_id, "run.html")


@router.get("/runs/{run_id}/live")
def run_fragment(request: Request, run_id: str, caller: UiCaller, rt: RuntimeDep) -> Response:
    """The part of the run page that changes (status, facts, approvals, steps), for htmx to swap in."""
    return _shown(request, rt, caller, run_id, "_run_live.html")


async def _ui_event_stream(request: Request, run_id: str, caller: UiCaller, reads: Reads, rt: RuntimeDep,
                           last_event_id: Annotated[str, Header(max_length=100)] = "0"
                           ) -> AsyncIterator[EventStream]:
    """Admit a UI stream before its headers go out: 404 unless the caller may see the run, then as the
    JSON API admits one, for the run's tenant (its plan's stream slots; an operator's stream takes one too)."""
    raw = await reads.run(run_id) if RUN_ID.fullmatch(run_id) else None
    run = Run.model_validate_json(raw) if raw is not None else None
    if run is None or not caller.can_see(run.spec.tenant):
        raise HTTPException(404, f"no run {run_id!r}")
    policy = rt.tenants.policy_from(run.spec.tenant, await reads.tenant(run.spec.tenant))
    if policy is None:
        raise HTTPException(404, f"no run {run_id!r}")
    async with asynccontextmanager(open_event_stream)(run_id, request, policy, last_event_id) as stream:
        yield stream


@router.get("/runs/{run_id}/events", response_class=EventSourceResponse)
async def run_events_ui(run_id: str, request: Request, stream: Annotated[EventStream, Depends(_ui_event_stream)]
                        ) -> AsyncIterator[ServerSentEvent]:
    """The run's event stream, as `GET /v1/runs/{id}/events` serves it (the same code, the same caps),
    authorised by the UI session (EventSource sends no Authorization header); it ends when the session does."""
    async for event in run_events(run_id, request, stream):
        yield event


def _back(run_id: str) -> RedirectResponse:
    return RedirectResponse(f"/ui/runs/{run_id}", 303)


def _acting(request: Request, rt: RuntimeDep, caller: UiPrincipal, run_id: str) -> Run | Response:
    """The run a form acts on, or the page refusing it (404: not the caller's; 403: an operator key)."""
    run = _visible(rt, caller, run_id)
    if run is None:
        return not_found(request, f"run {run_id}")
    if caller.is_operator:
        return error_page(request, 403, "an operator key only looks; a tenant's key acts on its runs")
    return run


@router.post("/runs/{run_id}/approvals")
def decide(request: Request, run_id: str, caller: CsrfChecked, rt: RuntimeDep,
           decision: Annotated[Literal["approve", "reject"], Form()],
           call_id: Annotated[str, Form(max_length=200)] = "",
           reason: Annotated[str, Form(max_length=2000)] = "") -> Response:
    run = _acting(request, rt, caller, run_id)
    if not isinstance(run, Run):
        return run
    try:
        record_decision(rt.store, run.id, call_id or None, decision == "approve", f"ui:{caller.tenant}",
                        reason.strip() or None, send_step)
    except ApprovalConflict as exc:
        return error_page(request, 409, str(exc))
    return _back(run.id)


@router.post("/runs/{run_id}/cancel")
def cancel_run(request: Request, run_id: str, caller: CsrfChecked, rt: RuntimeDep) -> Response:
    run = _acting(request, rt, caller, run_id)
    if not isinstance(run, Run):
        return run
    cancel(rt.store, run.id, send_step)
    return _back(run.id)


@router.post("/runs/{run_id}/replay")
def replay_run(request: Request, run_id: str, caller: CsrfChecked, rt: RuntimeDep,
               from_step: Annotated[int, Form(ge=1, le=1000)]) -> Response:
    run = _acting(request, rt, caller, run_id)
    if not isinstance(run, Run):
        return run
    try:
        fork = replay(rt.store, rt.settings, run.id, from_step, send_step, tenants=rt.fresh_tenants(),
                      budgets=rt.budgets)
    except (InvalidRequest, TierNotAllowed) as exc:
        return error_page(request, 422 if isinstance(exc, InvalidRequest) else 403, str(exc))
    except AdmissionRefused as exc:
        return error_page(request, 429, str(exc))
    return _back(fork.id)
