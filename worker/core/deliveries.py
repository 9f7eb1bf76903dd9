"""Webhook delivery records: what is sent, to where, and every attempt with its outcome (pure models;
`worker/store/webhooks.py` keeps them, `worker/runtime/webhooks.py` makes the attempts)."""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from .tenant_ids import tenant_name

MAX_ATTEMPTS_KEPT = 50


class Event(StrEnum):
    RUN_FINISHED = "run.finished"
    BATCH_FINISHED = "batch.finished"


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # given up: retry window over, or the destination refused by the SSRF guard


class AttemptError(StrEnum):
    """Why an attempt did not deliver (closed set: the delivery log never carries an exception's text)."""

    REFUSED_ADDRESS = "refused_address"  # the host resolves to a non-public address (not retried)
    UNRESOLVABLE = "unresolvable"  # the host name did not resolve
    TIMEOUT = "timeout"
    CONNECTION_FAILED = "connection_failed"  # refused, reset, TLS handshake or certificate failure
    PROTOCOL_ERROR = "protocol_error"  # the receiver's answer was not valid HTTP
    HTTP_STATUS = "http_status"  # the receiver answered with a status other than 2xx


class Attempt(BaseModel):
    at: float
    status_code: int | None = None  # the receiver's HTTP status, if it answered
    error: str | None = None  # why it did not count, for people: "HTTP 500", "refused: ... non-public address"
    kind: AttemptError | None = None  # the same, for programs
    address: str | None = None  # the IP address connected to (or refused)
    duration_ms: int = 0
    response_bytes: int = 0  # bytes of the answer's body read (at most webhook_max_response_bytes and one read)


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
        """What `GET /v1/webhooks/deliveries` shows (not the body; the tenant's name, not its id)."""
        return {**self.model_dump(exclude={"body"}), "tenant": tenant_name(self.tenant)}

    def awaits(self, number: int) -> bool:
        """Whether attempt `number` (from 1) is the next to make: False once the delivery is done, or for a
        duplicate message of an attempt already recorded."""
        return self.state == DeliveryState.PENDING and len(self.attempts) == number - 1

    def add_attempt(self, number: int, attempt: Attempt, state: DeliveryState) -> bool:
        """Record attempt `number` and the state it leads to, once (False, nothing changed, unless `awaits`)."""
        if not self.awaits(number):
            return False
        self.attempts = (self.attempts + [attempt])[-MAX_ATTEMPTS_KEPT:]
        self.state = state
        return True
