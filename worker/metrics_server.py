"""Exposing /metrics from a worker process (the API serves it on its own port)."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

from . import metrics
from .parser import PARSE_ERROR_KINDS
from .runtime import Runtime

log = logging.getLogger("reactq.metrics")


def initialise(rt: Runtime) -> None:
    metrics.initialise(rt.settings.model, rt.settings.tenants, rt.tools.names(), (*PARSE_ERROR_KINDS, "loop"))
    try:
        from tools_sandbox.metrics import initialise as init_sandbox

        init_sandbox(rt.settings.tiers)
    except ImportError:
        pass


def start_metrics_server(port: int, rt: Runtime) -> bool:
    initialise(rt)
    try:
        start_http_server(port)
    except OSError as exc:
        log.warning("metrics port %s unavailable (%s); this process exports no /metrics", port, exc)
        return False
    log.info("metrics on :%s/metrics", port)
    return True
