"""HTTP routes of one run: submit it, read it, follow its events, cancel it, decide its approvals, replay
it, delete it. Every route acts for the caller's tenant only; another tenant's run is a 404, like an
unknown one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, Field, StrictBool, WithJsonSchema, field_validator

from ..core.models import MAX_INSTRUCTIONS_CHARS, Finite, Instructions, Mode, Run, RunSpec, Text, json_integer
from ..core.views import run_json
from ..errors import ApprovalConflict
from ..runtime.approvals import record_decision
from ..service.replay import replay
from ..service.retention import delete_run
from ..service.submit import MAX_DEADLINE_S, cancel, submit
from ..store.async_reads import AsyncReads
from ..store.streams import StreamSlots
from ..tasks.steps import send_step
from ..tenancy.admission import StreamSlot
from ..tenancy.tenants import Policy
from .app_state import RuntimeDep, stream_gate_of, stream_reads_of
from .auth import CallerPolicy, CallerTenant, bearer_scheme, caller_tenant, key_refusal
from .guards import EVENT_ID, ID_PATTERN, Question, WebhookUrl, check_event_id, check_id, owned_run
from .schemas import AUTHED, Deleted, RunView, RunWithTrace, errors, json_errors, links

router = APIRouter(dependencies=[Depends(bearer_scheme)])
RunId = Annotated[str, Path(json_schema_extra={"pattern": ID_PATTERN})]  # checked by owned_run (400)
_RUN = errors(*AUTHED, 400, 404)
_CREATED_RUN = links(201, "run_id", {"get": "get_run", "cancel": "cancel_run", "approve": "decide_approval",
                                     "replay": "replay_run", "delete": "delete_run_route"})


# What the document can state of an output schema: an object whose `type` is "object" (the rest, a valid
# JSON Schema with local references only, is checked by worker/output_schema.py: 422 naming the problem)
OutputSchema = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "properties": {"type": {"const": "object"}}, "required": ["type"],
    "additionalProperties": True})]


class RunRequest(BaseModel, extra="forbid"):
    question: Question = Field(description="not blank; at most REACTQ_MAX_QUESTION_CHARS characters")
    tenant: Text | None = Field(None, description="accepted only when it is the caller's own (the key decides)")
    tier: Text | None = Field(None, min_length=1, description="one the plan allows; default: the plan's default tier")
    max_steps: int | None = Field(None, ge=1, le=200)
    mode: Mode | None = None
    model: Text | None = Field(None, description="the default model or one of REACTQ_MODELS")
    id: Text | None = Field(None, description="the client's own id of the run, shown back as `id`")
    max_tokens: int | None = Field(None, gt=0, description="the run's token budget")
    max_cost_usd: Finite | None = Field(None, gt=0, description="the run's cost budget in USD")
    deadline_s: Finite | None = Field(None, ge=1, le=MAX_DEADLINE_S, description="the run's wall time")
    webhook_url: WebhookUrl | None = Field(None, description="called when the run finishes")
    instructions: Instructions | None = Field(None, description="added to the run's system prompt; at most "
                                              f"{MAX_INSTRUCTIONS_CHARS} characters")
    output_schema: OutputSchema | None = Field(None, description="a JSON Schema (an object at its root, local "
                                               "$refs only, at most 16 KiB) the final answer must fit; the run's "
                                               "`output` is then the validated object")
    python_session: StrictBool | None = Field(None, description="python keeps its globals across the run's calls; "
                                        "default: the plan's")

    _integers = field_validator("max_steps", "max_tokens", mode="before")(json_integer)


def run_spec(r: RunRequest, policy: Policy, where: str, tier: str | None = None) -> RunSpec:
    """The spec of one requested run, for the caller's tenant (a body naming another is refused)."""
    if r.tenant is not None and r.tenant not in (policy.tenant, policy.name):
        raise HTTPException(403, f"{where}the tenant comes from your API key; this key acts for {policy.name!r}")
    return RunSpec(question=r.question, tenant=policy.tenant, tier=r.tier or tier or policy.plan.default_tier,
                   max_steps=r.max_steps, mode=r.mode, model=r.model, client_id=r.id, max_tokens=r.max_tokens,
                   max_cost_usd=r.max_cost_usd, deadline_s=r.deadline_s, webhook_url=r.webhook_url,
                   instructions=r.instructions, output_schema=r.output_schema,
                   python_session=r.python_session)


@router.post("/v1/runs", status_code=201, response_model=RunView,
             responses={**errors(*AUTHED, 400, 413, 429), **_CREATED_RUN})
def create_run(body: RunRequest, policy: CallerPolicy, rt: RuntimeDep) -> dict:
    [run] = submit(rt.store, [run_spec(body, policy, "")], rt.settings, send_step, interactive=True,
                   tenants=rt.fresh_tenants(), budgets=rt.budgets)
    return run_json(run)


@router.get("/v1/runs/{run_id}", response_model=RunWithTrace, response_model_exclude_unset=True,
            responses=_RUN)
def get_run(run_id: RunId, tenant: CallerTenant, rt: RuntimeDep, trace: bool = False) -> dict:
    run = owned_run(rt.store, run_id, tenant)
    return run_json(run, rt.store.load_steps(run_id) if trace else None)


@router.post("/v1/runs/{run_id}/cancel", response_model=RunView, responses=_RUN)
def cancel_run(run_id: RunId, tenant: CallerTenant, rt: RuntimeDep) -> dict:
    owned_run(rt.store, run_id, tenant)
    run = cancel(rt.store, run_id, send_step)
    assert run is not None
    return run_json(run)


READ_BLOCK_MS = 5000  # an open stream re-checks its key (and renews its slot) at least this often


@dataclass
class EventStream:
    """One admitted event stream: the run, where to resume, the streams' own reads, the tenant's slot."""

    run_id: str
    last: str
    reads: AsyncReads
    slot: StreamSlot


async def open_event_stream(run_id: RunId, request: Request, policy: CallerPolicy,
                            last_event_id: Annotated[str, Header(
                                max_length=100, description="resume after this event (the `id:` of the last "
                                "one received; 0: from the start)", json_schema_extra={"pattern": EVENT_ID.pattern})
                            ] = "0"
                            ) -> AsyncIterator[EventStream]:
    """Admit a stream before its headers go out: 422 for a malformed `Last-Event-ID`, 429 past the process's
    cap or the tenant's plan, 404 for another tenant's run. Its place and slot are given back when it ends."""
    last = check_event_id(last_event_id)
    check_id(run_id)
    with stream_gate_of(request).held():
        reads = stream_reads_of(request)
        raw = await reads.run(run_id)
        if raw is None or Run.model_validate_json(raw).spec.tenant != policy.tenant:
            raise HTTPException(404, f"no run {run_id!r}")
        slot = StreamSlot(StreamSlots(reads.client), policy)
        await slot.open()
        try:
            yield EventStream(run_id, last, reads, slot)
        finally:
            await asyncio.shield(slot.close())


@router.get("/v1/runs/{run_id}/events", response_class=EventSourceResponse, responses={
    200: {"description": "the run's events as server-sent events, until it finishes"},  # FastAPI's itemSchema
    **json_errors(*AUTHED, 400, 404, 422, 429)})
async def run_events(run_id: RunId, request: Request, stream: Annotated[EventStream, Depends(open_event_stream)]
                     ) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events: queued, each step as it is recorded, finished. Resumes after `Last-Event-ID`.
    A tenant may hold its plan's number of streams open at once, and an API process
    REACTQ_SSE_MAX_STREAMS_PER_PROCESS (429 past either). A stream whose key is revoked, or whose tenant is
    removed, ends within its next read with an `error` event."""
    run_id, last, reads = stream.run_id, stream.last, stream.reads
    while True:
        compacted = await reads.compacted_events(run_id)
        if compacted is not None:  # the run has finished and its stream was compacted
            for entry_id, kind, data in json.loads(compacted):
                if _stream_id(entry_id) > _stream_id(last):
                    if kind == "step" and isinstance(data, int):
                        data = ((await reads.step(run_id, data)) or b"{}").decode()
                    yield ServerSentEvent(id=entry_id, event=kind, raw_data=data)
            return
        for entry_id, kind, data in await reads.events_after(run_id, last, count=100, block_ms=READ_BLOCK_MS):
            last = entry_id
            if kind == "step" and data.isdigit():  # the step's index: the step is in the run's step list
                data = ((await reads.step(run_id, int(data))) or b"{}").decode()
            yield ServerSentEvent(id=entry_id, event=kind, raw_data=data)
            if kind == "finished":
                return
        refused = await key_refusal(request, reads)
        if refused is not None:
            yield ServerSentEvent(event="error", data={"error": {"message": refused.detail,
                                                                 "status": refused.status_code}})
            return
        await stream.slot.renew()
        yield ServerSentEvent(comment="keep-alive")


def _stream_id(text: str) -> tuple[int, int]:
    """A Redis stream entry id (`ms-seq`, or a bare `ms`) as a comparable pair; garbage sorts first."""
    ms, _, seq = text.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


class ApprovalRequest(BaseModel, extra="forbid"):
    decision: Literal["approve", "reject"]
    call_id: Text | None = Field(None, max_length=200, description="the pending call; all of them when absent")
    reason: Text | None = Field(None, max_length=2000, description="told to the model when rejecting")


@router.post("/v1/runs/{run_id}/approvals", response_model=RunView, responses=errors(*AUTHED, 400, 404, 409, 413))
def decide_approval(run_id: RunId, body: ApprovalRequest, rt: RuntimeDep,
                    tenant: str = Depends(caller_tenant)) -> dict:
    """Approve or reject the run's call awaiting approval (409 when there is none to decide)."""
    owned_run(rt.store, run_id, tenant)
    try:
        run = record_decision(rt.store, run_id, body.call_id, body.decision == "approve", f"api:{tenant}",
                     body.reason, send_step)
    except ApprovalConflict as exc:
        raise HTTPException(409, str(exc)) from None
    return run_json(run)


class ReplayRequest(BaseModel, extra="forbid"):
    from_step: int = Field(ge=1, description="the first step to run again, from 1 (as the trace numbers them)")
    model: Text | None = Field(None, max_length=200)
    mode: Mode | None = None
    tier: Text | None = Field(None, max_length=200, description="default: the source run's, if the plan allows it")

    _integers = field_validator("from_step", mode="before")(json_integer)


@router.post("/v1/runs/{run_id}/replay", status_code=201, response_model=RunView,
             responses={**errors(*AUTHED, 400, 403, 404, 409, 413, 429), **_CREATED_RUN})
def replay_run(run_id: RunId, body: ReplayRequest, policy: CallerPolicy, rt: RuntimeDep) -> dict:
    """A new run reusing this run's steps before `from_step` and continuing from there. It is admitted as a
    submission is: the caller's plan as it is now, its budgets and admission limits (403, 422, 429); 409 for
    a `from_step` past the steps the run has recorded."""
    owned_run(rt.store, run_id, policy.tenant)
    run = replay(rt.store, rt.settings, run_id, body.from_step, send_step, tenants=rt.fresh_tenants(),
                 budgets=rt.budgets, model=body.model, mode=body.mode, tier=body.tier)
    return run_json(run)


@router.delete("/v1/runs/{run_id}", response_model=Deleted, responses=_RUN)
def delete_run_route(run_id: RunId, rt: RuntimeDep, tenant: str = Depends(caller_tenant)) -> dict:
    """Remove the run and everything stored for it, now (an unfinished run is cancelled first)."""
    delete_run(rt.store, owned_run(rt.store, run_id, tenant))
    return {"deleted": run_id}
