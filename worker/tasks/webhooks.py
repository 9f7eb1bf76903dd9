"""The webhook delivery task (queue `reactq.webhooks`). A step worker does not take it in its own pool:
`reactq worker` starts a small webhook worker process beside it (worker/runtime/webhook_pool.py), so a slow
receiver never holds a step thread. Which attempt may start when: worker/runtime/webhook_fair.py."""

from __future__ import annotations

from functools import cache
from typing import Any

from ..config import get_settings
from ..names import WEBHOOK_TASK, WEBHOOKS_QUEUE
from ..runtime.context import get_runtime
from ..runtime.webhook_fair import DeliveryGates, FairShares, deliver_fairly
from ..runtime.webhooks import Delivery, attempt_loaded
from ..store.webhook_slots import WebhookSlots
from .app import app


def send_delivery(delivery_id: str, attempt: int, countdown: float, deferred: int = 0) -> None:
    args: list[Any] = [delivery_id, attempt] + ([deferred] if deferred else [])
    deliver.apply_async(args=args, queue=WEBHOOKS_QUEUE, countdown=countdown or None)


@cache
def gates(shares: FairShares) -> DeliveryGates:
    """This process's retry lane and lookups (one set per process: they count its threads)."""
    return DeliveryGates(shares)


@app.task(name=WEBHOOK_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(self: Any, delivery_id: str, attempt: int, deferred: int = 0) -> None:
    """Attempt `attempt` of one delivery, or put it off when its tenant, host or the retry lane is full;
    schedules the next message when it failed and time is left."""
    from ..runtime.webhook_http import WebhookHTTP  # httpx: a worker loads it as it starts (worker_setup.py)

    rt = get_runtime(get_settings)
    s = rt.settings
    http = WebhookHTTP(deadline_s=s.webhook_deadline_s, max_response_bytes=s.webhook_max_response_bytes)
    own = gates(FairShares(tenant_in_flight=s.webhook_tenant_in_flight, host_in_flight=s.webhook_host_in_flight,
                           retry_threads=s.webhook_retry_threads))

    def make(delivery: Delivery) -> float | None:
        return attempt_loaded(rt.webhooks, delivery, attempt, http, allow_private=s.webhook_allow_private,
                              retry_base_s=s.webhook_retry_base_s, retry_max_s=s.webhook_retry_max_s,
                              retry_for_s=s.webhook_retry_for_s, lookups=own.lookups)

    following = deliver_fairly(rt.webhooks, WebhookSlots(rt.redis), own, delivery_id, attempt, s.webhook_deadline_s,
                               make, deferred)
    if following is not None:
        send_delivery(delivery_id, following.number, following.countdown, following.deferred)
