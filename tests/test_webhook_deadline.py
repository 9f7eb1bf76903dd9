"""Webhooks cost at most their deadline: hostile receivers on loopback (a real HTTP server that drips its
body a byte a second after a 200, streams a terabyte, or never answers) against `attempt_delivery` in
process, with the delivery log in a real redis-server. Each attempt ends at its deadline with a recorded
reason, reads at most the body cap, and closes the connection (the receiver sees the client go)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

import pytest
import redis

from tests.fixtures_receiver import HUGE_BODY, Receiver
from worker.runtime.webhooks import AttemptError, Delivery, DeliveryState, Event, WebhookHTTP, attempt_delivery
from worker.store.webhooks import WebhookStore

GENEROUS_S = 60  # far above every deadline below, even on a loaded machine: the attempt must have ended


@pytest.fixture
def store(redis_url: str) -> WebhookStore:
    return WebhookStore(redis.Redis.from_url(redis_url), keep_s=3600)


def attempt(store: WebhookStore, url: str, http: WebhookHTTP) -> Delivery:
    """One attempt, made in a thread that must end well within GENEROUS_S; the delivery as recorded."""
    delivery = store.create(Delivery(tenant="default", event=Event.RUN_FINISHED, subject_id="r1", url=url,
                                     body=json.dumps({"run_id": "r1"})))
    worker = threading.Thread(target=attempt_delivery, args=(store, delivery.id, 1, http), daemon=True,
                              kwargs={"allow_private": True, "retry_base_s": 1, "retry_max_s": 1, "retry_for_s": 600})
    worker.start()
    worker.join(GENEROUS_S)
    assert not worker.is_alive(), "the attempt did not end at its deadline"
    done = store.load(delivery.id)
    assert done is not None
    return done


def client_gone(receiver: Receiver) -> None:
    receiver.wait_for("the client to close the connection", lambda calls: bool(calls) and calls[0].client_closed,
                      timeout=GENEROUS_S)


def test_a_receiver_dripping_its_body_after_200_fails_the_attempt_at_the_deadline(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    receiver = make_receiver(behaviour="drip", drip_s=0.3)
    delivery = attempt(store, receiver.url, WebhookHTTP(deadline_s=2))
    [made] = delivery.attempts
    assert made.kind == AttemptError.TIMEOUT and made.status_code == 200
    assert made.error == "HTTP 200, but the body did not end within the 2 s deadline"
    assert delivery.state == DeliveryState.PENDING  # retried on the usual schedule
    assert made.duration_ms >= 2000 and 0 < made.response_bytes < 1000  # it waited out the deadline, no more
    client_gone(receiver)


def test_a_receiver_that_never_answers_fails_the_attempt_at_the_deadline(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    receiver = make_receiver(behaviour="hang")
    delivery = attempt(store, receiver.url, WebhookHTTP(deadline_s=1.5))
    [made] = delivery.attempts
    assert (made.kind, made.status_code, made.response_bytes) == (AttemptError.TIMEOUT, None, 0)
    assert made.error == "no answer within the 1.5 s deadline" and delivery.state == DeliveryState.PENDING
    client_gone(receiver)


def test_headers_trickled_a_byte_at_a_time_fail_the_attempt_at_the_deadline(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    """Every byte comes well within any per-read timeout, and the headers never end."""
    receiver = make_receiver(behaviour="trickle", drip_s=0.1)
    delivery = attempt(store, receiver.url, WebhookHTTP(deadline_s=1.5))
    [made] = delivery.attempts
    assert (made.kind, made.status_code, made.error) == (AttemptError.TIMEOUT, None,
                                                         "no answer within the 1.5 s deadline")
    assert receiver.calls[0].sent >= 3  # the receiver was trickling all along
    client_gone(receiver)


def test_a_huge_body_is_read_up_to_the_cap_then_the_connection_is_closed(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    receiver = make_receiver(behaviour="huge")
    cap = 64 * 1024
    delivery = attempt(store, receiver.url, WebhookHTTP(deadline_s=30, max_response_bytes=cap))
    [made] = delivery.attempts
    assert delivery.state == DeliveryState.DELIVERED and made.status_code == 200 and made.kind is None
    assert cap <= made.response_bytes <= 2 * cap  # the cap and at most one more read
    client_gone(receiver)
    sent = receiver.calls[0].sent  # what the receiver got into the socket before it broke: buffers, not the body
    assert sent < 64 * 1024 * 1024 < HUGE_BODY, sent


def test_a_zero_cap_reads_no_body(store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    """The status decides: with REACTQ_WEBHOOK_MAX_RESPONSE_BYTES=0 a dripping 200 delivers at once."""
    quick = attempt(store, make_receiver(behaviour="drip", drip_s=0.1).url, WebhookHTTP(max_response_bytes=0))
    assert quick.state == DeliveryState.DELIVERED and quick.attempts[0].status_code == 200


def test_a_slow_name_lookup_counts_against_the_deadline(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    """A name server that takes longer than the deadline (the tenant may run it): the attempt ends at the
    deadline as a timeout, and nothing is sent."""
    receiver = make_receiver()
    release = threading.Event()

    def slow(host: str, port: int, **_: object) -> list:
        release.wait(GENEROUS_S)  # a lookup that hangs until the test ends
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    delivery = store.create(Delivery(tenant="default", event=Event.RUN_FINISHED, subject_id="r1",
                                     url=f"http://hooks.slow.invalid:{receiver.port}/hook", body="{}"))
    try:
        attempt_delivery(store, delivery.id, 1, WebhookHTTP(deadline_s=1), allow_private=True, retry_base_s=1,
                         retry_max_s=1, retry_for_s=600, resolve=slow)
    finally:
        release.set()
    done = store.load(delivery.id)
    assert done is not None and done.state == DeliveryState.PENDING
    [made] = done.attempts
    assert made.kind == AttemptError.TIMEOUT
    assert made.error == "hooks.slow.invalid did not resolve within the 1 s deadline"
    assert receiver.calls == []
