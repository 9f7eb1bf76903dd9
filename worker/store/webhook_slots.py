"""Webhook attempts in flight, shared by every webhook worker: a slot per attempt in its tenant's set and
in its destination host's, held for the attempt's deadline and a margin, so that a worker that dies
mid-attempt frees its slots when the hold lapses. Whether an attempt may start now is
`worker/runtime/webhook_fair.py`'s business."""

from __future__ import annotations

import redis

from . import keys
from .scripts import lua

__all__ = ["WebhookSlots"]

TAKE = lua(__file__, "take_slots.lua")
CAPS = ("tenant", "host")  # the order of the keys take() passes


class WebhookSlots:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._take = client.register_script(TAKE)

    def take(self, tenant: str, host: str, token: str, tenant_cap: int, host_cap: int, hold_ms: int) -> str | None:
        """A slot of the tenant's `tenant_cap` and of the host's `host_cap` for `hold_ms`; None when taken,
        else which cap is full (`tenant` or `host`), with nothing taken."""
        full = int(self._take(keys=[keys.webhook_tenant_in_flight(tenant), keys.webhook_host_in_flight(host)],
                              args=[token, hold_ms, tenant_cap, host_cap]))
        return CAPS[full - 1] if full else None

    def give_back(self, tenant: str, host: str, token: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.zrem(keys.webhook_tenant_in_flight(tenant), token)
        pipe.zrem(keys.webhook_host_in_flight(host), token)
        pipe.execute()
