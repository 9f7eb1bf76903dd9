"""The two routes that need no API key: `GET /healthz` (is Redis reachable) and `GET /metrics` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import metrics
from .app_state import RuntimeDep, async_reads_of
from .schemas import Health, errors

router = APIRouter()


@router.get("/healthz", response_model=Health, responses=errors(503))
async def healthz(request: Request) -> dict:
    try:
        await (await async_reads_of(request)).ping()
    except Exception:  # the URL and the driver's message may name hosts and credentials: say no more
        raise HTTPException(503, "Redis is unreachable") from None
    return {"status": "ok"}


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus exposition"}})
def metrics_endpoint(rt: RuntimeDep) -> Response:
    try:
        for queue, depth in rt.cluster.queue_depths().items():
            metrics.QUEUE_DEPTH.labels(queue).set(depth)
        metrics.RUNS_IN_PROGRESS.set(rt.cluster.active_count())
    except Exception:  # Redis down: still serve the counters this process has
        pass
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
