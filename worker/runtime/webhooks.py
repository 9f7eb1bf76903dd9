"""Webhooks: a callback when a run or batch finishes, instead of polling.

Where they go: a run's own `webhook_url`, else (for a run outside a batch) its tenant's default URL; a
batch's `webhook_url`, else its tenant's default. A run inside a batch calls only its own line's URL, so a
10,000-line batch makes one call for the batch, not 10,000.

What is sent: `POST` of the run as `GET /v1/runs/{id}` returns it, or of the batch as `GET
/v1/batches/{id}` returns it without its `run_ids` page (counts, statuses, usage and `runs_url` to page
through the runs: a 100,000-run batch is not a multi-MB body). Headers: `X-Reactq-Event` (`run.finished` |
`batch.finished`), `X-Reactq-Delivery` (the idempotency id: the same on every retry of one delivery),
`X-Reactq-Timestamp` (unix seconds when this attempt was signed) and `X-Reactq-Signature: v1=<hex>`, the
HMAC-SHA256 under the tenant's secret of `"{timestamp}.{raw body}"`. Receivers check both with `verify()`
(stale after 300 s by default, so a captured request cannot be replayed later). A 2xx answer delivers it;
anything else (redirects included: none is followed), or no answer within the attempt's deadline, is
retried with backoff until `webhook_retry_for_s` after it was created. An attempt costs at most
`webhook_deadline_s` (connect, headers and body together) and reads at most `webhook_max_response_bytes`
of the answer (worker/runtime/webhook_http.py). Every attempt is recorded with its status or a typed error
(`AttemptError`); a failed webhook never touches the run.

SSRF stance: only `http`/`https` URLs without credentials. Before every attempt the host is resolved once;
the delivery is refused (not retried) if any address is not globally routable (loopback, private,
link-local — the cloud metadata address 169.254.169.254 among them —, shared, reserved, multicast,
unspecified; IPv4-mapped IPv6 judged as IPv4), unless the operator sets `REACTQ_WEBHOOK_ALLOW_PRIVATE=1`
(tests, or a deployment whose receivers are internal). The request then connects to the address that was
checked (the URL's host is kept in `Host` and as the TLS server name, so certificates are verified
against it): the name cannot resolve to another address between the check and the connection (DNS
rebinding).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..core.deliveries import Attempt, AttemptError, Delivery, DeliveryState, Event
from ..errors import InvalidRequest, SignatureInvalid, WebhookUnreachable
from ..store.webhooks import WebhookStore
from .webhook_dns import Lookups

if TYPE_CHECKING:
    from .webhook_http import WebhookHTTP, pinned_url

__all__ = ["Attempt", "AttemptError", "Delivery", "DeliveryState", "Event", "Lookups", "WebhookHTTP",
           "attempt_delivery", "attempt_loaded", "backoff_s", "pinned_url", "queue_delivery", "resolve_target",
           "set_default_url", "sign", "validate_url", "verify"]

MAX_URL_CHARS = 2000
SIGNATURE_HEADER = "X-Reactq-Signature"
TIMESTAMP_HEADER = "X-Reactq-Timestamp"
DELIVERY_HEADER = "X-Reactq-Delivery"
EVENT_HEADER = "X-Reactq-Event"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_S = 300


def __getattr__(name: str) -> Any:
    """WebhookHTTP and pinned_url, imported on first use: whoever only queues deliveries (a finishing run,
    `reactq batch`) does not need httpx and httpcore."""
    if name in ("WebhookHTTP", "pinned_url"):
        from . import webhook_http

        return getattr(webhook_http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SignatureProblem(StrEnum):
    MISSING = "missing"
    MALFORMED = "malformed"
    STALE = "stale"
    MISMATCH = "mismatch"


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


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not (address.is_multicast or address.is_unspecified or address.is_reserved)


Resolver = Callable[..., list[Any]]  # socket.getaddrinfo's signature (tests pass a name server of their own)


def resolve_target(host: str, port: int, allow_private: bool, resolve: Resolver = socket.getaddrinfo) -> list[str]:
    """The host's addresses, resolved once, each allowed as a destination; raises (internally) when the
    name does not resolve, or (unless `allow_private`) when any address is not a public one."""
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise WebhookUnreachable(AttemptError.UNRESOLVABLE, f"{host} does not resolve") from None
    addresses: list[str] = []
    for info in infos:
        text = str(info[4][0]).split("%")[0]
        address = ipaddress.ip_address(text)
        if not allow_private and not _public(address):
            raise WebhookUnreachable(AttemptError.REFUSED_ADDRESS,
                                     f"refused: {host} resolves to a non-public address (REACTQ_WEBHOOK_ALLOW_PRIVATE)",
                                     text)
        if text not in addresses:
            addresses.append(text)
    if not addresses:
        raise WebhookUnreachable(AttemptError.UNRESOLVABLE, f"{host} does not resolve")
    return addresses


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The `X-Reactq-Signature` value: `v1=` and the hex HMAC-SHA256 of `"{timestamp}.{body}"`."""
    signed = str(timestamp).encode() + b"." + body
    return f"{SIGNATURE_VERSION}=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, timestamp: str | None, signature: str | None,
           tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None) -> int:
    """A receiver's check of one delivery: the raw body, and the `X-Reactq-Timestamp` and
    `X-Reactq-Signature` headers as received. Returns the timestamp; raises `SignatureInvalid` (its
    `problem` a `SignatureProblem`) when a header is missing or malformed, the timestamp is more than
    `tolerance_s` away from now (a replayed or badly delayed request), or no `v1=` signature matches.

        from worker.runtime.webhooks import verify
        verify(secret, request.body, request.headers.get("X-Reactq-Timestamp"),
               request.headers.get("X-Reactq-Signature"))
    """
    if not timestamp or not signature:
        raise SignatureInvalid(SignatureProblem.MISSING, "the timestamp or signature header is missing")
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        raise SignatureInvalid(SignatureProblem.MALFORMED, "the timestamp is not unix seconds")
    sent = int(timestamp)
    offered = [part.strip()[len(SIGNATURE_VERSION) + 1:] for part in signature.split(",")
               if part.strip().startswith(SIGNATURE_VERSION + "=")]
    if not offered:
        raise SignatureInvalid(SignatureProblem.MALFORMED, f"the signature has no {SIGNATURE_VERSION}= value")
    age = (time.time() if now is None else now) - sent
    if abs(age) > tolerance_s:
        raise SignatureInvalid(SignatureProblem.STALE,
                               f"the timestamp is {age:.0f} s old (tolerance {tolerance_s:g} s)")
    expected = sign(secret, body, sent)[len(SIGNATURE_VERSION) + 1:]
    if not any(hmac.compare_digest(expected.encode(), candidate.encode()) for candidate in offered):
        raise SignatureInvalid(SignatureProblem.MISMATCH, "the signature does not match the body and timestamp")
    return sent


def backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """Wait before attempt number `attempt + 1` (attempt counts from 1)."""
    return float(min(max_s, base_s * 2 ** (attempt - 1)))


def set_default_url(store: WebhookStore, tenant: str, url: str | None) -> None:
    """Set the tenant's default URL (validated first: InvalidRequest) or, with None, clear it."""
    store.set_default(tenant, None if url is None else validate_url(url))


def queue_delivery(store: WebhookStore, tenant: str, event: Event, subject_id: str, url: str,
                   payload: dict[str, Any], send: Callable[[str, int, float], None]) -> Delivery:
    body = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    delivery = store.create(Delivery(tenant=tenant, event=event, subject_id=subject_id, url=url, body=body))
    send(delivery.id, 1, 0.0)
    return delivery


UNSHARED_LOOKUPS = Lookups(per_tenant=4)  # for callers that pass none (the worker passes its own)


def attempt_delivery(store: WebhookStore, delivery_id: str, number: int, http: WebhookHTTP, *,
                     allow_private: bool, retry_base_s: float, retry_max_s: float,
                     retry_for_s: float, resolve: Resolver = socket.getaddrinfo,
                     lookups: Lookups = UNSHARED_LOOKUPS) -> float | None:
    """Make attempt `number`; returns the countdown to the next attempt, or None when there is none."""
    delivery = store.load(delivery_id)
    if delivery is None or not delivery.awaits(number):
        return None  # expired, done, or a duplicate message of an attempt already made
    return attempt_loaded(store, delivery, number, http, allow_private=allow_private, retry_base_s=retry_base_s,
                          retry_max_s=retry_max_s, retry_for_s=retry_for_s, resolve=resolve, lookups=lookups)


def attempt_loaded(store: WebhookStore, delivery: Delivery, number: int, http: WebhookHTTP, *,
                   allow_private: bool, retry_base_s: float, retry_max_s: float, retry_for_s: float,
                   resolve: Resolver = socket.getaddrinfo, lookups: Lookups = UNSHARED_LOOKUPS) -> float | None:
    """`attempt_delivery` of a delivery already loaded (and awaiting attempt `number`)."""
    started, begun = time.time(), time.monotonic()
    parts = urlsplit(delivery.url)
    attempt = Attempt(at=started)
    try:
        addresses = resolve_target(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
                                   allow_private, lookups.bounded(resolve, delivery.tenant, http.deadline_s))
        body = delivery.body.encode()
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "reactq-webhooks/1",
            EVENT_HEADER: delivery.event.value,
            DELIVERY_HEADER: delivery.id,
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(store.secret(delivery.tenant), body, timestamp),
        }
        from .webhook_http import post  # loaded by now: `http` is a WebhookHTTP

        answer = post(http, delivery.url, addresses, body, headers, start=begun)
        attempt.status_code, attempt.address, attempt.response_bytes = (answer.status_code, answer.address,
                                                                       answer.body_bytes)
        if answer.kind is not None:
            attempt.error, attempt.kind = answer.error, answer.kind
        elif not 200 <= (answer.status_code or 0) < 300:
            attempt.error, attempt.kind = f"HTTP {answer.status_code}", AttemptError.HTTP_STATUS
    except WebhookUnreachable as exc:
        attempt.error, attempt.kind, attempt.address = str(exc), AttemptError(exc.kind), exc.address
    attempt.duration_ms = int((time.time() - started) * 1000)
    wait = backoff_s(number, retry_base_s, retry_max_s)
    if attempt.kind is None:
        state = DeliveryState.DELIVERED
    elif attempt.kind == AttemptError.REFUSED_ADDRESS or time.time() + wait > delivery.created_at + retry_for_s:
        state = DeliveryState.FAILED
    else:
        state = DeliveryState.PENDING
    recorded = store.record(delivery.id, number, attempt, state)
    return wait if recorded is not None and state == DeliveryState.PENDING else None
