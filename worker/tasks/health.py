"""Feeds a worker's probes (worker/runtime/metrics_server.py) from Celery's own signals.

`heartbeat_sent` fires each time the consumer's event loop sends its worker heartbeat (every 2 s; Celery
sends it unless the worker runs with --without-heartbeat, which would fail /livez): proof that the loop
that takes messages is turning, not only that some thread of the process is. Connected at import, before
the consumer is built (Celery checks for receivers then). That the worker consumes is said at worker_ready,
in worker/tasks/worker_setup.py's start-up.
"""

from __future__ import annotations

from typing import Any

from celery import signals

from ..runtime.metrics_server import HEALTH


@signals.heartbeat_sent.connect(weak=False, dispatch_uid="reactq-health-beat")
def _beat(**_: Any) -> None:
    HEALTH.beat()


@signals.worker_shutting_down.connect(weak=False, dispatch_uid="reactq-health-stopping")
def _stopping(**_: Any) -> None:
    HEALTH.stopping()
