"""What the HTTP API answers, as models: the OpenAPI document describes every response with them, and
FastAPI checks each answer against its route's model (a route that drifted from its model fails loudly
in tests instead of surprising a client). `errors(...)` documents the error statuses a route answers,
all in the one shape `{"error": {"message", "status"}}`; `links(...)` the follow-up operations a
created run or batch offers (clients and Schemathesis's stateful tests follow them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..core.deliveries import Attempt, DeliveryState, Event
from ..core.models import Approval, Mode, RunStatus, Step, Usage
from ..tenancy.plans import PlanLimits


class ErrorDetail(BaseModel):
    message: str
    status: int


class ErrorBody(BaseModel):
    error: ErrorDetail


_WHY = {
    400: "a malformed run or batch id (ids are 1-64 letters, digits, '-' or '_'), or a body that is not UTF-8",
    401: "no API key, or an unknown one (`Authorization: Bearer KEY`)",
    403: "a revoked key, a tenant other than the key's, or a tier the plan does not allow",
    404: "no such run or batch for this tenant (another tenant's answers the same)",
    409: "the run's state does not allow it: no call awaiting approval to decide, or a replay from past the "
         "steps the run has recorded",
    413: "the request body is larger than REACTQ_MAX_BODY_BYTES",
    422: "the request is invalid: the message names each bad field and why",
    429: "an admission limit or budget of the plan is reached; `Retry-After` says when to try again",
    503: "the run store (Redis) is unavailable; try again shortly",
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries of these error statuses, each with the error body's model."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {"model": ErrorBody, "description": _WHY[status]}
        if status == 429:
            out[status]["headers"] = RETRY_AFTER
        if status == 401:
            out[status]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return out


def json_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`errors(...)` for a route whose own answer is not JSON (the event stream): FastAPI would state its
    errors in the route's media type, and they are JSON."""
    out = errors(*statuses)
    for entry in out.values():
        del entry["model"]  # registered in the document's components by every other route
        entry["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    return out


AUTHED = (401, 403, 422, 503)  # every route behind a key: no or bad key, invalid parameters, Redis down


def links(status: int, id_field: str, targets: dict[str, str], param: str | None = None) -> dict[int | str, Any]:
    """OpenAPI links from a `status` answer whose body has `id_field`: each target operation id gets
    that value as its `param` (default: `id_field`)."""
    return {status: {"links": {
        name: {"operationId": op, "parameters": {param or id_field: f"$response.body#/{id_field}"}}
        for name, op in targets.items()}}}


class RunView(BaseModel):
    """A run as `GET /v1/runs/{run_id}` (and `reactq status --json`) shows it."""

    id: str | None = Field(description="the client's id of the run (`id` of the request), if it gave one")
    run_id: str
    status: RunStatus
    answer: str | None
    output: dict[str, Any] | None = Field(None, description="with an `output_schema`: the final answer's object, "
                                          "validated by it")
    partial: bool = Field(False, description="`answer` is a best-effort answer given at a limit (see `status`)")
    steps: int = Field(description="steps taken so far")
    usage: Usage
    cost_usd: float
    model: str
    error: str | None
    question: str
    tenant: str
    tier: str
    mode: Mode
    created_at: float
    updated_at: float
    finished_at: float | None
    waiting_on: str | None = Field(description="why a running run is not moving, e.g. 'sandbox'")
    max_steps: int
    approvals: list[Approval]
    forked_from: str | None = Field(description="the run this one was replayed from")


class RunWithTrace(RunView):
    trace: list[Step] | None = Field(None, description="every step, with `?trace=true`")


class RunPage(BaseModel):
    runs: list[RunView]
    next_cursor: str | None = Field(description="pass it as `cursor` for the next page; null at the end")


class Deleted(BaseModel):
    deleted: str


class BatchCreated(BaseModel):
    batch_id: str
    run_ids: list[str]


class BatchView(BaseModel):
    batch_id: str
    size: int
    finished: int
    unfinished: int
    statuses: dict[str, int] = Field(description="finished runs by status")
    usage: dict[str, float] = Field(description="prompt_tokens, completion_tokens and cost_usd so far")
    runs_url: str
    run_ids: list[str] = Field(description="a page of the batch's run ids, from `offset`")
    next_offset: int | None = Field(description="the next page's `offset`; null at the end")


class BatchCancelled(BaseModel):
    batch_id: str
    cancelled: int
    already_finished: int


class BatchDeleted(Deleted):
    runs: int = Field(description="how many runs were removed")


class Period(BaseModel):
    tokens: int
    usd: float
    tokens_budget: int | None
    usd_budget: float | None
    resets_at: str


class UsageTotal(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class UsageReport(BaseModel):
    tenant: str
    plan: str
    day: Period
    month: Period
    total: UsageTotal
    runs_in_flight: int
    limits: PlanLimits


class DeliveryView(BaseModel):
    """One webhook delivery and its attempts (the signed body is not shown)."""

    id: str
    tenant: str
    event: Event
    subject_id: str
    url: str
    state: DeliveryState
    created_at: float
    attempts: list[Attempt]


class DeliveryPage(BaseModel):
    deliveries: list[DeliveryView]
    next_before: float | None = Field(description="pass it as `before` for the next page; null at the end")


class Health(BaseModel):
    status: str
