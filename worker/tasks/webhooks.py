"""The webhook delivery task (queue `reactq.webhooks`, consumed by step workers by default)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import httpx

from ..names import WEBHOOK_TASK, WEBHOOKS_QUEUE
from ..runtime.context import get_runtime
from ..runtime.webhooks import attempt_delivery
from .app import app


def send_delivery(delivery_id: str, attempt: int, countdown: float) -> None:
    deliver.apply_async(args=[delivery_id, attempt], queue=WEBHOOKS_QUEUE, countdown=countdown or None)


@lru_cache(maxsize=1)
def _client() -> httpx.Client:
    # No kept-alive connections: requests go to IP addresses (worker/runtime/webhooks.py), and a pooled TLS
    # connection, keyed by address only, could carry a request for another host name than it verified.
    return httpx.Client(timeout=get_runtime().settings.webhook_timeout_s, follow_redirects=False,
                        limits=httpx.Limits(max_keepalive_connections=0))


@app.task(name=WEBHOOK_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(self: Any, delivery_id: str, attempt: int) -> None:
    """Attempt `attempt` of one delivery; schedules the next one when it failed and time is left."""
    rt = get_runtime()
    s = rt.settings
    wait = attempt_delivery(rt.webhooks, delivery_id, attempt, _client(), allow_private=s.webhook_allow_private,
                            retry_base_s=s.webhook_retry_base_s, retry_max_s=s.webhook_retry_max_s,
                            retry_for_s=s.webhook_retry_for_s)
    if wait is not None:
        send_delivery(delivery_id, attempt + 1, wait)
