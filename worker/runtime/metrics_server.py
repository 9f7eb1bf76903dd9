"""Exposing /metrics from a worker process (the API serves it on its own port).

A `reactq worker` is one process running a Celery threads pool, so the default prometheus-client
registry already holds every thread's figures: no multiprocess mode is needed (or used).
"""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

from .. import metrics
from ..core.parser import PARSE_ERROR_KINDS
from ..tenancy.plans import known_tiers
from .context import Runtime

log = logging.getLogger("reactq.metrics")


def initialise(rt: Runtime) -> None:
    metrics.initialise(rt.settings.model, rt.settings.tenants, rt.tools.names(), (*PARSE_ERROR_KINDS, "loop"))
    try:
        from tools_sandbox.metrics import init_labels as init_sandbox
    except ImportError:  # a step-only host without tools_sandbox
        return
    init_sandbox(known_tiers(rt.settings), rt.settings.tenants)


def start_metrics_server(port: int, rt: Runtime) -> bool:
    initialise(rt)
    try:
        start_http_server(port)
    except OSError as exc:
        log.warning("metrics port %s unavailable (%s); this process exports no /metrics", port, exc)
        return False
    log.info("metrics on :%s/metrics", port)
    return True
