"""The HTTP API: submit runs and batches, read them, follow a run's events, cancel, /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, ValidationError
from redis import asyncio as aioredis
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import keys, metrics
from .core.models import Mode, RunSpec
from .display import run_json
from .errors import InvalidRequest
from .metrics_server import initialise
from .runtime import get_runtime
from .submit import cancel, new_batch_id, submit
from .tasks import send_step


@asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    initialise(get_runtime())
    yield


app = FastAPI(title="reactq", version="0.1.0", lifespan=_lifespan)


class RunRequest(BaseModel, extra="forbid"):
    question: str
    tenant: str = "default"
    tier: str = "standard"
    max_steps: int | None = None
    mode: Mode | None = None
    model: str | None = None
    deadline_s: float | None = None
    id: str | None = None


class BatchRequest(BaseModel, extra="forbid"):
    runs: list[RunRequest] = Field(min_length=1, max_length=10_000)
    tenant: str | None = None
    tier: str | None = None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "status": status}})


@app.exception_handler(StarletteHTTPException)  # ours, and the framework's own (unknown route, wrong method)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return _error(exc.status_code, str(exc.detail))


@app.exception_handler(InvalidRequest)
async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
    return _error(422, str(exc))


@app.exception_handler(ValidationError)
@app.exception_handler(RequestValidationError)
async def _validation(_: Request, exc: ValidationError | RequestValidationError) -> JSONResponse:
    return _error(422, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))


def _spec(r: RunRequest, tenant: str | None = None, tier: str | None = None) -> RunSpec:
    return RunSpec(question=r.question, tenant=tenant or r.tenant, tier=tier or r.tier, max_steps=r.max_steps,
                   mode=r.mode, model=r.model, deadline_s=r.deadline_s, client_id=r.id)


@app.post("/v1/runs", status_code=201)
def create_run(body: RunRequest) -> dict:
    rt = get_runtime()
    [run] = submit(rt.store, [_spec(body)], rt.settings, send_step, interactive=True)
    return run_json(run)


@app.post("/v1/batches", status_code=201)
def create_batch(body: BatchRequest) -> dict:
    rt = get_runtime()
    batch_id = new_batch_id()
    specs = [_spec(r, body.tenant, body.tier) for r in body.runs]
    rt.store.create_batch(batch_id, {"size": str(len(specs))})
    runs = submit(rt.store, specs, rt.settings, send_step, batch_id=batch_id)
    return {"batch_id": batch_id, "run_ids": [r.id for r in runs]}


@app.get("/v1/runs/{run_id}")
def get_run(run_id: str, trace: bool = False) -> dict:
    rt = get_runtime()
    run = rt.store.load_run(run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return run_json(run, rt.store.load_steps(run_id) if trace else None)


@app.post("/v1/runs/{run_id}/cancel")
def cancel_run(run_id: str) -> dict:
    rt = get_runtime()
    if rt.store.load_run(run_id) is None:
        raise HTTPException(404, f"no run {run_id!r}")
    run = cancel(rt.store, run_id)
    assert run is not None
    return run_json(run)


_events_redis: aioredis.Redis | None = None


def _events_client() -> aioredis.Redis:
    """An asyncio client for the event streams: a waiting SSE client holds no thread."""
    global _events_redis
    if _events_redis is None:
        s = get_runtime().settings
        _events_redis = aioredis.Redis.from_url(s.redis_url, max_connections=s.redis_max_connections)
    return _events_redis


@app.get("/v1/runs/{run_id}/events")
async def run_events(run_id: str, request: Request) -> StreamingResponse:
    """Server-sent events: queued, each step as it is recorded, finished. Resumes after `Last-Event-ID`."""
    client = _events_client()
    if not await client.exists(keys.run(run_id)):
        raise HTTPException(404, f"no run {run_id!r}")

    async def stream() -> AsyncIterator[str]:
        last = request.headers.get("last-event-id", "0")
        while True:
            result = await client.xread({keys.events(run_id): last}, count=100, block=15_000)
            for _stream, entries in result or []:
                for entry_id, fields in entries:
                    last = entry_id.decode()
                    kind, data = fields[b"type"].decode(), fields[b"data"].decode()
                    yield f"id: {last}\nevent: {kind}\ndata: {data}\n\n"
                    if kind == "finished":
                        return
            yield ": keep-alive\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


@app.get("/v1/batches/{batch_id}")
def get_batch(batch_id: str) -> dict:
    rt = get_runtime()
    info = rt.store.batch_info(batch_id)
    if not info:
        raise HTTPException(404, f"no batch {batch_id!r}")
    run_ids = rt.store.batch_run_ids(batch_id)
    counts: dict[str, int] = {}
    for run in rt.store.load_runs(run_ids):
        if run is not None:
            counts[run.status.value] = counts.get(run.status.value, 0) + 1
    return {
        "batch_id": batch_id,
        "size": len(run_ids),
        "finished": rt.store.batch_finished_count(batch_id),
        "statuses": counts,
        "usage": {k: float(v) for k, v in info.items() if k in ("prompt_tokens", "completion_tokens", "cost_usd")},
        "run_ids": run_ids,
    }


@app.get("/healthz")
def healthz() -> dict:
    rt = get_runtime()
    try:
        rt.redis.ping()
    except Exception as exc:
        raise HTTPException(503, f"Redis at {rt.settings.redis_url} unreachable: {exc}") from None
    return {"status": "ok"}


@app.get("/metrics")
def metrics_endpoint() -> Response:
    rt = get_runtime()
    try:
        for queue, depth in rt.cluster.queue_depths().items():
            metrics.QUEUE_DEPTH.labels(queue).set(depth)
        metrics.RUNS_IN_PROGRESS.set(rt.store.active_count())
    except Exception:  # Redis down: still serve the counters this process has
        pass
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
