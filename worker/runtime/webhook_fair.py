"""Which webhook attempt may start now: tenants and destination hosts share the webhook workers fairly.

One queue carries every tenant's deliveries. An attempt holds a webhook thread for up to its deadline, so
a tenant whose receiver accepts and never answers (or whose name server never answers) would fill every
thread and put everyone else's webhooks behind its own, retried for a day. So, before an attempt starts:

- **retries have a lane**: at most `retry_threads` of this process's threads make retries (attempt 2 and
  on) at once; the others are kept for first attempts, which never wait behind retries;
- **caps in flight**, cluster-wide in Redis (worker/store/webhook_slots.py): at most `tenant_in_flight`
  attempts of one tenant and `host_in_flight` to one destination host name;
- an attempt that may not start is **deferred**: the same attempt is sent again after a short wait that
  doubles each time it is deferred (from DEFER_BASE_S up to DEFER_MAX_S, with jitter), and its message is
  acked. Nothing is recorded: a deferral is not an attempt. The thread goes to the next message at once.

Name lookups are bounded per tenant as well (worker/runtime/webhook_dns.py).
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..core.deliveries import Delivery
from ..store.webhook_slots import WebhookSlots
from ..store.webhooks import WebhookStore
from .webhook_dns import Lookups

DEFER_BASE_S = 0.5
DEFER_MAX_S = 30.0
HOLD_MARGIN_S = 30.0  # a slot's hold beyond the attempt's deadline (then a dead worker's slot lapses)


@dataclass(frozen=True)
class FairShares:
    tenant_in_flight: int = 4
    host_in_flight: int = 8
    retry_threads: int = 4


@dataclass(frozen=True)
class Next:
    """The message to send after this one: attempt `number` after `countdown` s (`deferred` times put off)."""

    number: int
    countdown: float
    deferred: int = 0


class DeliveryGates:
    """One webhook worker process's gates: its retry lane and its name lookups."""

    def __init__(self, shares: FairShares) -> None:
        self.shares = shares
        self.retry_lane = threading.BoundedSemaphore(max(1, shares.retry_threads))
        self.lookups = Lookups(per_tenant=shares.tenant_in_flight)


def defer_s(deferred: int) -> float:
    """The wait before a deferred attempt is tried again, the `deferred`-th time it was put off (from 0)."""
    return min(DEFER_MAX_S, DEFER_BASE_S * 2 ** min(deferred, 16)) * random.uniform(0.75, 1.25)


def destination_host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def deliver_fairly(store: WebhookStore, slots: WebhookSlots, gates: DeliveryGates, delivery_id: str, number: int,
                   deadline_s: float, attempt: Callable[[Delivery], float | None], deferred: int = 0) -> Next | None:
    """Make attempt `number` of the delivery with `attempt` (returns the countdown to the next attempt, or
    None) if its lane and caps let it start now, else defer it. Returns the message to send next, if any."""
    delivery = store.load(delivery_id)
    if delivery is None or not delivery.awaits(number):
        return None  # expired, done, or a duplicate message of an attempt already made
    put_off = Next(number, defer_s(deferred), deferred + 1)
    lane = gates.retry_lane if number > 1 else None
    if lane is not None and not lane.acquire(blocking=False):
        return put_off
    try:
        host, token = destination_host(delivery.url), uuid.uuid4().hex
        shares = gates.shares
        if slots.take(delivery.tenant, host, token, shares.tenant_in_flight, shares.host_in_flight,
                      int((deadline_s + HOLD_MARGIN_S) * 1000)) is not None:
            return put_off
        try:
            wait = attempt(delivery)
        finally:
            slots.give_back(delivery.tenant, host, token)
    finally:
        if lane is not None:
            lane.release()
    return None if wait is None else Next(number + 1, wait)
