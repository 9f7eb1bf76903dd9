"""The HTTP API: submit runs and batches, read them, follow a run's events, cancel, /metrics.

Every route but /healthz and /metrics acts for the tenant of the caller's API key (`caller_tenant`);
another tenant's run or batch answers 404 exactly like an unknown one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, ValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import metrics
from ..core.models import Mode, Run, RunSpec
from ..core.views import run_json
from ..errors import InvalidRequest
from ..runtime.context import get_runtime
from ..runtime.finish_hooks import batch_may_be_finished
from ..runtime.metrics_server import initialise
from ..runtime.webhooks import validate_url
from ..service.submit import TierNotAllowed, cancel, new_batch_id, submit
from ..store import keys
from ..store.batch_view import batch_view
from ..tasks.steps import send_step, sending_together
from ..tasks.webhooks import send_delivery
from ..tenancy.admission import AdmissionRefused, StreamSlot, TooLarge
from ..tenancy.tenants import Policy
from . import run_actions as api_runs_extra
from .auth import CallerPolicy, CallerTenant, async_redis
from .guards import BodyLimit, check_id, owned_batch, owned_run
from .tenancy_routes import router as tenancy_router

log = logging.getLogger("reactq.api")


@asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    initialise(get_runtime())
    yield


app = FastAPI(title="reactq", version="0.1.0", lifespan=_lifespan)
app.add_middleware(BodyLimit, max_bytes=get_runtime().settings.max_body_bytes)
app.include_router(tenancy_router)
app.include_router(api_runs_extra.router)


class RunRequest(BaseModel, extra="forbid"):
    question: str
    tenant: str | None = None  # accepted only when it is the caller's own (the key decides)
    tier: str | None = None  # default: the plan's default tier
    max_steps: int | None = None
    mode: Mode | None = None
    model: str | None = None
    id: str | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    deadline_s: float | None = None
    webhook_url: str | None = None


class BatchRequest(BaseModel, extra="forbid"):
    runs: list[RunRequest] = Field(min_length=1, max_length=10_000)
    tenant: str | None = None
    tier: str | None = None
    webhook_url: str | None = None  # called once when the whole batch has finished


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "status": status}})


@app.exception_handler(StarletteHTTPException)  # ours, and the framework's own (unknown route, wrong method)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    response = _error(exc.status_code, str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


@app.exception_handler(TierNotAllowed)
async def _tier_refused(_: Request, exc: TierNotAllowed) -> JSONResponse:
    return _error(403, str(exc))


@app.exception_handler(AdmissionRefused)
async def _too_many(_: Request, exc: AdmissionRefused) -> JSONResponse:
    response = _error(429, str(exc))
    response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


@app.exception_handler(RedisError)
async def _store_down(_: Request, exc: RedisError) -> JSONResponse:
    log.warning("Redis error while serving a request: %s", exc.__class__.__name__)
    return _error(503, "the run store is unavailable; try again shortly")


@app.exception_handler(TooLarge)
async def _too_large(_: Request, exc: TooLarge) -> JSONResponse:
    return _error(422, str(exc))


@app.exception_handler(InvalidRequest)
async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
    return _error(422, str(exc))


@app.exception_handler(ValidationError)
@app.exception_handler(RequestValidationError)
async def _validation(_: Request, exc: ValidationError | RequestValidationError) -> JSONResponse:
    return _error(422, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))


def _spec(r: RunRequest, policy: Policy, where: str, tier: str | None = None) -> RunSpec:
    """The spec of one requested run, for the caller's tenant (a body naming another is refused)."""
    if r.tenant is not None and r.tenant != policy.tenant:
        raise HTTPException(403, f"{where}the tenant comes from your API key; this key acts for {policy.tenant!r}")
    return RunSpec(question=r.question, tenant=policy.tenant, tier=r.tier or tier or policy.plan.default_tier,
                   max_steps=r.max_steps, mode=r.mode, model=r.model, client_id=r.id, max_tokens=r.max_tokens,
                   max_cost_usd=r.max_cost_usd, deadline_s=r.deadline_s, webhook_url=r.webhook_url)


@app.post("/v1/runs", status_code=201)
def create_run(body: RunRequest, policy: CallerPolicy) -> dict:
    rt = get_runtime()
    [run] = submit(rt.store, [_spec(body, policy, "")], rt.settings, send_step, interactive=True)
    return run_json(run)


@app.post("/v1/batches", status_code=201)
def create_batch(body: BatchRequest, policy: CallerPolicy) -> dict:
    """Every item is checked before anything is written (422 naming each bad item's index)."""
    rt = get_runtime()
    if body.tenant is not None and body.tenant != policy.tenant:
        raise HTTPException(403, f"the tenant comes from your API key; this key acts for {policy.tenant!r}")
    batch_id = new_batch_id()
    specs = [_spec(r, policy, f"runs[{i}]: ", body.tier) for i, r in enumerate(body.runs)]
    meta = {"size": str(len(specs)), "tenant": policy.tenant}
    if body.webhook_url is not None:
        meta["webhook_url"] = validate_url(body.webhook_url)
    rt.store.batches.create(batch_id, {**meta, "submitting": "1"})  # first: a run may end before submit returns
    try:
        with sending_together() as send:
            runs = submit(rt.store, specs, rt.settings, send, batch_id=batch_id)
    except Exception:
        rt.store.batches.drop_record(batch_id)
        raise
    rt.store.batches.mark_submitted(batch_id, len(runs))
    batch_may_be_finished(rt, batch_id, send_delivery, policy.tenant)
    return {"batch_id": batch_id, "run_ids": [r.id for r in runs]}


@app.get("/v1/runs/{run_id}")
def get_run(run_id: str, tenant: CallerTenant, trace: bool = False) -> dict:
    run = owned_run(run_id, tenant)
    return run_json(run, get_runtime().store.load_steps(run_id) if trace else None)


@app.post("/v1/runs/{run_id}/cancel")
def cancel_run(run_id: str, tenant: CallerTenant) -> dict:
    owned_run(run_id, tenant)
    run = cancel(get_runtime().store, run_id, send_step)
    assert run is not None
    return run_json(run)


@app.get("/v1/runs/{run_id}/events")
async def run_events(run_id: str, request: Request, policy: CallerPolicy) -> StreamingResponse:
    """Server-sent events: queued, each step as it is recorded, finished. Resumes after `Last-Event-ID`.
    A tenant may hold its plan's number of streams open at once (429 past that)."""
    client = async_redis()
    raw = await client.get(keys.run(check_id(run_id)))
    if raw is None or Run.model_validate_json(raw).spec.tenant != policy.tenant:
        raise HTTPException(404, f"no run {run_id!r}")
    slot = StreamSlot(client, policy)
    await slot.open()

    async def stream() -> AsyncIterator[str]:
        last = request.headers.get("last-event-id", "0")
        try:
            while True:
                compacted = await client.get(keys.events_compacted(run_id))
                if compacted is not None:  # the run has finished and its stream was compacted
                    for entry_id, kind, data in json.loads(compacted):
                        if _stream_id(entry_id) > _stream_id(last):
                            if kind == "step" and isinstance(data, int):
                                data = ((await client.lindex(keys.steps(run_id), data)) or b"{}").decode()
                            yield f"id: {entry_id}\nevent: {kind}\ndata: {data}\n\n"
                    return
                result = await client.xread({keys.events(run_id): last}, count=100, block=15_000)
                for _stream, entries in result or []:
                    for entry_id, fields in entries:
                        last = entry_id.decode()
                        kind, data = fields[b"type"].decode(), fields[b"data"].decode()
                        yield f"id: {last}\nevent: {kind}\ndata: {data}\n\n"
                        if kind == "finished":
                            return
                await slot.renew()
                yield ": keep-alive\n\n"
        finally:
            await asyncio.shield(slot.close())

    return StreamingResponse(stream(), media_type="text/event-stream")


def _stream_id(text: str) -> tuple[int, int]:
    """A Redis stream entry id (`ms-seq`, or a bare `ms`) as a comparable pair; garbage sorts first."""
    ms, _, seq = text.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


@app.get("/v1/batches/{batch_id}")
def get_batch(batch_id: str, tenant: CallerTenant, offset: Annotated[int, Query(ge=0)] = 0,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> dict:
    """The batch's figures and a page of its run ids (`next_offset` is the next page's, null at the end)."""
    owned_batch(batch_id, tenant)
    store = get_runtime().store
    view = batch_view(store, batch_id)
    if view is None:
        raise HTTPException(404, f"no batch {batch_id!r}")
    run_ids = store.batches.run_ids_page(batch_id, offset, limit)
    more = offset + len(run_ids) < view["size"]
    return {**view, "run_ids": run_ids, "next_offset": offset + len(run_ids) if more else None}


@app.get("/healthz")
async def healthz() -> dict:
    try:
        await async_redis().ping()
    except Exception:  # the URL and the driver's message may name hosts and credentials: say no more
        raise HTTPException(503, "Redis is unreachable") from None
    return {"status": "ok"}


@app.get("/metrics")
def metrics_endpoint() -> Response:
    rt = get_runtime()
    try:
        for queue, depth in rt.cluster.queue_depths().items():
            metrics.QUEUE_DEPTH.labels(queue).set(depth)
        metrics.RUNS_IN_PROGRESS.set(rt.cluster.active_count())
    except Exception:  # Redis down: still serve the counters this process has
        pass
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
