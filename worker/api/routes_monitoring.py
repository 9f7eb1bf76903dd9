"""The routes that need no API key: `GET /healthz` (is Redis reachable: readiness), `GET /livez` (the event
loop answers: liveness, no Redis), and `GET /metrics` (Prometheus) only when REACTQ_API_METRICS_PORT is 0.

/metrics names tenants and their spend, so by default it is not on this port at all: `reactq api` serves
it on REACTQ_API_METRICS_PORT (worker/runtime/metrics_server.py), which only Prometheus may reach."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..runtime.metrics_server import refresh_cluster_gauges
from .app_state import RuntimeDep, async_reads_of
from .schemas import Health, errors

router = APIRouter()
metrics_router = APIRouter()  # mounted by create_app only when /metrics is served on the API's own port


@router.get("/healthz", response_model=Health, responses=errors(503))
async def healthz(request: Request) -> dict:
    try:
        await (await async_reads_of(request)).ping()
    except Exception:  # the URL and the driver's message may name hosts and credentials: say no more
        raise HTTPException(503, "Redis is unreachable") from None
    return {"status": "ok"}


@router.get("/livez", response_class=PlainTextResponse, include_in_schema=False)
async def livez() -> str:
    """The kubelet's liveness probe: answering at all is the proof (a Redis outage must not restart the API)."""
    return "ok"


@metrics_router.get("/metrics", response_class=Response, responses={
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus exposition"}})
def metrics_endpoint(rt: RuntimeDep) -> Response:
    refresh_cluster_gauges(rt)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
