"""Webhooks in Redis: each tenant's default URL and signing secret, the delivery records and each tenant's
delivery log. The caller validates URLs and makes the attempts (`worker/runtime/webhooks.py`)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import redis

from ..core.deliveries import Attempt, Delivery, DeliveryState
from . import keys
from .cas import write_watched
from .connection import mget


class WebhookStore:
    """Tenants' default URL and secret, and the delivery records (kept `keep_s`)."""

    def __init__(self, client: redis.Redis, keep_s: int) -> None:
        self.r = client
        self.keep_s = keep_s

    def set_default(self, tenant: str, url: str | None) -> None:
        """Set (an already validated URL) or, with None, clear the tenant's default URL."""
        if url is None:
            self.r.hdel(keys.tenant_webhook(tenant), "url")
        else:
            self.r.hset(keys.tenant_webhook(tenant), "url", url)

    def default_url(self, tenant: str) -> str | None:
        raw = self.r.hget(keys.tenant_webhook(tenant), "url")
        return raw.decode() if raw else None

    def secret(self, tenant: str, rotate: bool = False) -> str:
        """The tenant's signing secret, created on first use."""
        key = keys.tenant_webhook(tenant)
        if rotate:
            self.r.hset(key, "secret", secrets.token_hex(32))
        else:
            self.r.hsetnx(key, "secret", secrets.token_hex(32))
        raw = self.r.hget(key, "secret")
        assert raw is not None
        return raw.decode()

    def create(self, delivery: Delivery) -> Delivery:
        pipe = self.r.pipeline(transaction=False)  # on a cluster the record and the tenant's index are apart
        pipe.set(keys.webhook_delivery(delivery.id), delivery.model_dump_json(), ex=self.keep_s)
        pipe.zadd(keys.tenant_deliveries(delivery.tenant), {delivery.id: delivery.created_at})
        pipe.zremrangebyscore(keys.tenant_deliveries(delivery.tenant), "-inf", time.time() - self.keep_s)
        pipe.execute()
        return delivery

    def load(self, delivery_id: str) -> Delivery | None:
        raw = self.r.get(keys.webhook_delivery(delivery_id))
        return Delivery.model_validate_json(raw) if raw else None

    def record(self, delivery_id: str, number: int, attempt: Attempt, state: DeliveryState) -> Delivery | None:
        """Add attempt `number` (from 1) once: a duplicate of an attempt already recorded changes nothing."""
        key = keys.webhook_delivery(delivery_id)

        def decide(raw: bytes) -> tuple[Delivery, Callable[[Any], None]] | None:
            delivery = Delivery.model_validate_json(raw)
            if not delivery.add_attempt(number, attempt, state):
                return None

            def write(pipe: Any) -> None:
                pipe.set(key, delivery.model_dump_json(), keepttl=True)

            return delivery, write

        return write_watched(self.r, key, decide)

    def list(self, tenant: str, limit: int = 100, before: float | None = None) -> list[Delivery]:
        """The tenant's deliveries, newest first."""
        ids = self.r.zrevrangebyscore(keys.tenant_deliveries(tenant), f"({before}" if before else "+inf", "-inf",
                                      start=0, num=limit)
        raws = mget(self.r, [keys.webhook_delivery(i.decode()) for i in ids])
        return [Delivery.model_validate_json(raw) for raw in raws if raw]
