"""Webhook signatures with a timestamp (and the receivers' `verify` helper), and the SSRF guard at
delivery time: the host is resolved once, non-public addresses are refused, and the connection goes to
the address that was checked (DNS rebinding cannot move it). Deliveries are made in process by
`attempt_delivery` against a real local HTTP receiver, with the delivery log in a real redis-server."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures_receiver import Receiver
from worker.errors import SignatureInvalid, WebhookUnreachable
from worker.runtime.webhooks import (
    AttemptError,
    Delivery,
    DeliveryState,
    Event,
    SignatureProblem,
    WebhookHTTP,
    attempt_delivery,
    pinned_url,
    resolve_target,
    sign,
    verify,
)
from worker.store.webhooks import WebhookStore

SECRET = "s3cret"


# --- signing and verifying (pure) --------------------------------------------------------------

def test_signature_covers_the_timestamp_and_the_body() -> None:
    body, t = b'{"a": 1}', 1_700_000_000
    want = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, body, t) == f"v1={want}"
    assert sign(SECRET, body, t + 1) != sign(SECRET, body, t) != sign("other", body, t)
    assert verify(SECRET, body, str(t), sign(SECRET, body, t), now=t + 299) == t


@pytest.mark.parametrize(("timestamp", "signature", "now", "problem"), [
    (None, "v1=00", 0, SignatureProblem.MISSING),
    ("1700000000", None, 0, SignatureProblem.MISSING),
    ("17e8", "v1=00", 0, SignatureProblem.MALFORMED),
    ("-5", "v1=00", 0, SignatureProblem.MALFORMED),
    ("1700000000", "sha256=00", 0, SignatureProblem.MALFORMED),
    ("1700000000", "GOOD", 1_700_000_301, SignatureProblem.STALE),  # a replay five minutes later
    ("1700000000", "GOOD", 1_699_999_699, SignatureProblem.STALE),  # from too far in the future
    ("1700000001", "GOOD", 1_700_000_000, SignatureProblem.MISMATCH),  # the timestamp was changed
    ("1700000000", "v1=" + "0" * 64, 1_700_000_000, SignatureProblem.MISMATCH),
])
def test_verify_rejects(timestamp: str | None, signature: str | None, now: float, problem: SignatureProblem) -> None:
    body = b'{"a": 1}'
    if signature == "GOOD":
        signature = sign(SECRET, body, 1_700_000_000)
    with pytest.raises(SignatureInvalid) as caught:
        verify(SECRET, body, timestamp, signature, now=now)
    assert caught.value.problem == problem


def test_verify_accepts_any_of_several_signatures_and_a_custom_tolerance() -> None:
    body, t = b"{}", 1_700_000_000
    rotated = f"v1={'0' * 64}, {sign(SECRET, body, t)}"  # e.g. old and new secret during a rotation
    assert verify(SECRET, body, str(t), rotated, now=t) == t
    with pytest.raises(SignatureInvalid, match="tolerance 10 s"):
        verify(SECRET, body, str(t), sign(SECRET, body, t), tolerance_s=10, now=t + 11)
    with pytest.raises(SignatureInvalid):
        verify(SECRET, body + b" ", str(t), sign(SECRET, body, t), now=t)  # one byte of the body changed


# --- resolving the target (pure, with a name server of our own) -------------------------------

def answers(*addresses: str) -> Callable[..., list[Any]]:
    """A resolver (getaddrinfo's shape) answering these addresses, counting its calls."""
    def resolve(host: str, port: int, **_: Any) -> list[Any]:
        resolve.calls += 1  # type: ignore[attr-defined]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in addresses]
    resolve.calls = 0  # type: ignore[attr-defined]
    return resolve


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",  # metadata service
    "100.64.0.1", "0.0.0.0", "224.0.0.1", "240.0.0.1", "::1", "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
])
def test_non_public_addresses_are_refused(address: str) -> None:
    with pytest.raises(WebhookUnreachable) as caught:
        resolve_target("hooks.example.com", 443, False, answers(address))
    assert caught.value.kind == AttemptError.REFUSED_ADDRESS and caught.value.address == address
    assert resolve_target("hooks.example.com", 443, True, answers(address)) == [address]


def test_one_non_public_address_among_public_ones_refuses_the_host() -> None:
    with pytest.raises(WebhookUnreachable):
        resolve_target("hooks.example.com", 443, False, answers("93.184.216.34", "127.0.0.1"))
    assert resolve_target("hooks.example.com", 443, False, answers("93.184.216.34", "2606:2800:220:1::1")) == [
        "93.184.216.34", "2606:2800:220:1::1"]


def test_a_name_that_does_not_resolve_is_a_typed_error() -> None:
    def fails(*_: Any, **__: Any) -> list[Any]:
        raise socket.gaierror(-2, "Name or service not known")

    with pytest.raises(WebhookUnreachable) as caught:
        resolve_target("nowhere.invalid", 80, False, fails)
    assert caught.value.kind == AttemptError.UNRESOLVABLE and "Name or service" not in str(caught.value)


def test_pinned_url_keeps_everything_but_the_host() -> None:
    assert pinned_url("https://hooks.example.com:8443/a/b?c=d", "93.184.216.34") == "https://93.184.216.34:8443/a/b?c=d"
    assert pinned_url("http://hooks.example.com/x", "2606:2800:220:1::1") == "http://[2606:2800:220:1::1]/x"


# --- deliveries in process, against a real local receiver --------------------------------------

@pytest.fixture
def store(redis_url: str) -> WebhookStore:
    return WebhookStore(redis.Redis.from_url(redis_url), keep_s=3600)


def deliver(store: WebhookStore, url: str, *, allow_private: bool, resolve: Callable[..., list[Any]] | None = None,
            verify_tls: ssl.SSLContext | None = None) -> Delivery:
    delivery = store.create(Delivery(tenant="default", event=Event.RUN_FINISHED, subject_id="r1", url=url,
                                     body=json.dumps({"run_id": "r1"})))
    attempt_delivery(store, delivery.id, 1, WebhookHTTP(deadline_s=5, tls=verify_tls), allow_private=allow_private,
                     retry_base_s=1, retry_max_s=1, retry_for_s=60, **({"resolve": resolve} if resolve else {}))
    done = store.load(delivery.id)
    assert done is not None
    return done


def test_a_receiver_verifies_the_timestamped_signature(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    secret = store.secret("default")

    def judge(headers: dict[str, str], body: bytes) -> int:
        try:
            verify(secret, body, headers.get("x-reactq-timestamp"), headers.get("x-reactq-signature"))
        except SignatureInvalid:
            return 401
        return 200

    receiver = make_receiver(0, judge)
    delivered = deliver(store, receiver.url, allow_private=True)
    assert delivered.state == DeliveryState.DELIVERED, delivered.attempts
    [call] = receiver.calls
    assert call.answered == 200 and abs(int(call.headers["x-reactq-timestamp"]) - time.time()) < 60
    assert call.headers["x-reactq-signature"].startswith("v1=")

    store.secret("default", rotate=True)  # the receiver still holds the old secret: it refuses
    refused = deliver(store, receiver.url, allow_private=True)
    assert [a.status_code for a in refused.attempts] == [401] and refused.state == DeliveryState.PENDING
    assert refused.attempts[0].kind == AttemptError.HTTP_STATUS and refused.attempts[0].error == "HTTP 401"


def test_the_connection_goes_to_the_address_that_was_checked(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    """The name is resolved once, by our check; the request is sent to that address with the name in
    `Host`. Nothing else resolves it (the system's resolver does not know it), so a rebinding name
    server has no second answer to give."""
    receiver = make_receiver(0)
    port = receiver.port
    resolve = answers("127.0.0.1")
    delivered = deliver(store, f"http://hooks.rebind.invalid:{port}/hook", allow_private=True, resolve=resolve)
    assert delivered.state == DeliveryState.DELIVERED, delivered.attempts
    assert resolve.calls == 1  # type: ignore[attr-defined]
    [call] = receiver.calls
    assert call.headers["host"] == f"hooks.rebind.invalid:{port}" and call.path == "/hook"
    assert delivered.attempts[0].address == "127.0.0.1"


def test_refused_and_failed_attempts_are_logged_as_typed_errors(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    receiver = make_receiver(0)
    refused = deliver(store, receiver.url, allow_private=False)  # 127.0.0.1, and the operator did not allow it
    [attempt] = refused.attempts
    assert refused.state == DeliveryState.FAILED and receiver.calls == []  # refused: not retried
    assert attempt.kind == AttemptError.REFUSED_ADDRESS and attempt.address == "127.0.0.1"
    assert attempt.status_code is None and "non-public address" in (attempt.error or "")

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    failed = deliver(store, f"http://127.0.0.1:{closed}/hook", allow_private=True)
    [attempt] = failed.attempts
    assert failed.state == DeliveryState.PENDING  # retried later
    assert (attempt.kind, attempt.error, attempt.status_code) == (AttemptError.CONNECTION_FAILED, "could not connect",
                                                                  None)
    listed = [d.public() for d in store.list("default")]
    assert {a["kind"] for d in listed for a in d["attempts"]} == {"refused_address", "connection_failed"}


def test_https_is_verified_against_the_url_host_not_the_address(
        store: WebhookStore, make_receiver: Callable[..., Receiver], tmp_path: Path) -> None:
    """The request goes to the checked IP, but TLS still names the URL's host (SNI) and the certificate is
    checked against it: a certificate for another name is refused."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=hooks.test", "-addext", "subjectAltName=DNS:hooks.test", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    receiver = make_receiver(0, None, server)
    trusting = ssl.create_default_context(cafile=str(cert))

    good = deliver(store, f"https://hooks.test:{receiver.port}/hook", allow_private=True,
                   resolve=answers("127.0.0.1"), verify_tls=trusting)
    assert good.state == DeliveryState.DELIVERED, good.attempts
    assert receiver.calls[0].headers["host"] == f"hooks.test:{receiver.port}"

    wrong = deliver(store, f"https://elsewhere.test:{receiver.port}/hook", allow_private=True,
                    resolve=answers("127.0.0.1"), verify_tls=trusting)
    [attempt] = wrong.attempts
    assert attempt.kind == AttemptError.CONNECTION_FAILED and attempt.status_code is None
    assert len(receiver.calls) == 1
