"""Webhooks: a callback when a run or batch finishes, instead of polling.

Where they go: a run's own `webhook_url`, else (for a run outside a batch) its tenant's default URL; a
batch's `webhook_url`, else its tenant's default. A run inside a batch calls only its own line's URL, so a
10,000-line batch makes one call for the batch, not 10,000.

What is sent: `POST` of the run or batch as `GET /v1/...` returns it, with headers
`X-Reactq-Event` (`run.finished` | `batch.finished`), `X-Reactq-Delivery` (the idempotency id: the same on
every retry of one delivery) and `X-Reactq-Signature: sha256=<hex HMAC-SHA256 of the raw body under the
tenant's secret>`. A 2xx answer delivers it; anything else (redirects included: none is followed) is
retried with backoff until `webhook_retry_for_s` after it was created. Every attempt is recorded with its
status; a failed webhook never touches the run.

SSRF stance: only `http`/`https` URLs without credentials. Before every attempt the host is resolved and
the delivery is refused (not retried) if any address is loopback, private, link-local, reserved,
multicast or unspecified, unless the operator sets `REACTQ_WEBHOOK_ALLOW_PRIVATE=1` (tests, or a
deployment whose receivers are internal). The check and the connection resolve the name separately, so
DNS rebinding can slip past it: deployments that need a hard guarantee send egress through a proxy.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
import uuid
from collections.abc import Callable
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis
from pydantic import BaseModel, Field

from . import keys
from .errors import InvalidRequest

MAX_URL_CHARS = 2000
MAX_ATTEMPTS_KEPT = 50
SIGNATURE_HEADER = "X-Reactq-Signature"
DELIVERY_HEADER = "X-Reactq-Delivery"
EVENT_HEADER = "X-Reactq-Event"


class Event(StrEnum):
    RUN_FINISHED = "run.finished"
    BATCH_FINISHED = "batch.finished"


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # given up: retry window over, or the destination refused by the SSRF guard


class Attempt(BaseModel):
    at: float
    status_code: int | None = None  # the receiver's HTTP status, if it answered
    error: str | None = None  # why it did not count: timeout, connection refused, refused address, ...
    duration_ms: int = 0


class Delivery(BaseModel):
    id: str = Field(default_factory=lambda: "wh-" + uuid.uuid4().hex)
    tenant: str
    event: Event
    subject_id: str  # the run or batch id
    url: str
    body: str  # the exact bytes signed and sent (as UTF-8 text)
    state: DeliveryState = DeliveryState.PENDING
    created_at: float = Field(default_factory=time.time)
    attempts: list[Attempt] = Field(default_factory=list)

    def public(self) -> dict[str, Any]:
        """What `GET /v1/webhooks/deliveries` shows (not the body)."""
        return self.model_dump(exclude={"body"})


def validate_url(url: str) -> str:
    """The URL if it can be a webhook target; otherwise InvalidRequest saying why."""
    if len(url) > MAX_URL_CHARS:
        raise InvalidRequest(f"webhook_url is longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidRequest("webhook_url is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidRequest("webhook_url must be an http or https URL")
    if not parts.hostname:
        raise InvalidRequest("webhook_url has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidRequest("webhook_url must not carry credentials")
    if port == 0:
        raise InvalidRequest("webhook_url has port 0")
    return url


def _refused_address(host: str, port: int) -> str | None:
    """Why the host may not be called (it resolves to a non-public address), or None."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None  # the connection attempt reports it as a failure, and it is retried
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if (address.is_private or address.is_loopback or address.is_link_local or address.is_reserved
                or address.is_multicast or address.is_unspecified):
            return f"refused: {host} resolves to a non-public address (REACTQ_WEBHOOK_ALLOW_PRIVATE)"
    return None


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """Wait before attempt number `attempt + 1` (attempt counts from 1)."""
    return float(min(max_s, base_s * 2 ** (attempt - 1)))


class WebhookStore:
    """Tenants' default URL and secret, and the delivery records (Redis)."""

    def __init__(self, client: redis.Redis, keep_s: int) -> None:
        self.r = client
        self.keep_s = keep_s

    def set_default(self, tenant: str, url: str | None) -> None:
        if url is None:
            self.r.hdel(keys.tenant_webhook(tenant), "url")
        else:
            self.r.hset(keys.tenant_webhook(tenant), "url", validate_url(url))

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
        pipe = self.r.pipeline(transaction=True)
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
        with self.r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        return None
                    delivery = Delivery.model_validate_json(raw)
                    if delivery.state != DeliveryState.PENDING or len(delivery.attempts) != number - 1:
                        pipe.unwatch()
                        return None
                    delivery.attempts = (delivery.attempts + [attempt])[-MAX_ATTEMPTS_KEPT:]
                    delivery.state = state
                    pipe.multi()
                    pipe.set(key, delivery.model_dump_json(), keepttl=True)
                    pipe.execute()
                    return delivery
                except redis.WatchError:
                    continue

    def list(self, tenant: str, limit: int = 100, before: float | None = None) -> list[Delivery]:
        """The tenant's deliveries, newest first."""
        ids = self.r.zrevrangebyscore(keys.tenant_deliveries(tenant), f"({before}" if before else "+inf", "-inf",
                                      start=0, num=limit)
        raws = self.r.mget([keys.webhook_delivery(i.decode()) for i in ids]) if ids else []
        return [Delivery.model_validate_json(raw) for raw in raws if raw]


def queue_delivery(store: WebhookStore, tenant: str, event: Event, subject_id: str, url: str,
                   payload: dict[str, Any], send: Callable[[str, int, float], None]) -> Delivery:
    body = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    delivery = store.create(Delivery(tenant=tenant, event=event, subject_id=subject_id, url=url, body=body))
    send(delivery.id, 1, 0.0)
    return delivery


def attempt_delivery(store: WebhookStore, delivery_id: str, number: int, client: httpx.Client, *,
                     allow_private: bool, retry_base_s: float, retry_max_s: float,
                     retry_for_s: float) -> float | None:
    """Make attempt `number`; returns the countdown to the next attempt, or None when there is none."""
    delivery = store.load(delivery_id)
    if delivery is None or delivery.state != DeliveryState.PENDING or len(delivery.attempts) != number - 1:
        return None  # expired, done, or a duplicate message of an attempt already made
    started = time.time()
    parts = urlsplit(delivery.url)
    refused = None if allow_private else _refused_address(
        parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    status_code: int | None = None
    error = refused
    if refused is None:
        body = delivery.body.encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "reactq-webhooks/1",
            EVENT_HEADER: delivery.event.value,
            DELIVERY_HEADER: delivery.id,
            SIGNATURE_HEADER: sign(store.secret(delivery.tenant), body),
        }
        try:
            response = client.post(delivery.url, content=body, headers=headers)
            status_code = response.status_code
            if not 200 <= status_code < 300:
                error = f"HTTP {status_code}"
        except httpx.HTTPError as exc:
            error = f"{exc.__class__.__name__}"
    duration_ms = int((time.time() - started) * 1000)
    attempt = Attempt(at=started, status_code=status_code, error=error, duration_ms=duration_ms)
    wait = backoff_s(number, retry_base_s, retry_max_s)
    if error is None:
        state = DeliveryState.DELIVERED
    elif refused is not None or time.time() + wait > delivery.created_at + retry_for_s:
        state = DeliveryState.FAILED
    else:
        state = DeliveryState.PENDING
    recorded = store.record(delivery_id, number, attempt, state)
    return wait if recorded is not None and state == DeliveryState.PENDING else None
