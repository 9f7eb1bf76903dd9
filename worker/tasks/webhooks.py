"""The webhook delivery task (queue `reactq.webhooks`). A step worker does not take it in its own pool:
`reactq worker` starts a small webhook worker process beside it (worker/runtime/webhook_pool.py), so a slow
receiver never holds a step thread."""

from __future__ import annotations

from typing import Any

from ..config import get_settings
from ..names import WEBHOOK_TASK, WEBHOOKS_QUEUE
from ..runtime.context import get_runtime
from ..runtime.webhooks import WebhookHTTP, attempt_delivery
from .app import app


def send_delivery(delivery_id: str, attempt: int, countdown: float) -> None:
    deliver.apply_async(args=[delivery_id, attempt], queue=WEBHOOKS_QUEUE, countdown=countdown or None)


@app.task(name=WEBHOOK_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(self: Any, delivery_id: str, attempt: int) -> None:
    """Attempt `attempt` of one delivery; schedules the next one when it failed and time is left."""
    rt = get_runtime(get_settings)
    s = rt.settings
    http = WebhookHTTP(deadline_s=s.webhook_deadline_s, max_response_bytes=s.webhook_max_response_bytes)
    wait = attempt_delivery(rt.webhooks, delivery_id, attempt, http, allow_private=s.webhook_allow_private,
                            retry_base_s=s.webhook_retry_base_s, retry_max_s=s.webhook_retry_max_s,
                            retry_for_s=s.webhook_retry_for_s)
    if wait is not None:
        send_delivery(delivery_id, attempt + 1, wait)
