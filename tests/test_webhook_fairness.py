"""Webhooks are shared fairly: one tenant's receiver that accepts and never answers, or its name server
that never answers, does not put another tenant's webhooks behind its own. Real redis-server, real HTTP
receivers on loopback; the end-to-end test goes through real `reactq worker` processes and the API."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures_api import Api, make_key
from tests.fixtures_cluster import Cluster
from tests.fixtures_receiver import Receiver
from tests.waiting import wait_for
from worker.runtime.webhook_fair import DEFER_MAX_S, DeliveryGates, FairShares, defer_s, deliver_fairly
from worker.runtime.webhooks import (
    UNSHARED_LOOKUPS,
    Attempt,
    AttemptError,
    Delivery,
    DeliveryState,
    Event,
    WebhookHTTP,
    attempt_delivery,
    attempt_loaded,
)
from worker.store.webhook_slots import WebhookSlots
from worker.store.webhooks import WebhookStore

GENEROUS_S = 60


@pytest.fixture
def store(redis_url: str) -> WebhookStore:
    return WebhookStore(redis.Redis.from_url(redis_url), keep_s=3600)


def new_delivery(store: WebhookStore, tenant: str, url: str, failed_attempts: int = 0) -> Delivery:
    delivery = store.create(Delivery(tenant=tenant, event=Event.RUN_FINISHED, subject_id="r1", url=url,
                                     body=json.dumps({"run_id": "r1"})))
    for number in range(1, failed_attempts + 1):
        store.record(delivery.id, number, Attempt(at=0, kind=AttemptError.TIMEOUT, error="x"), DeliveryState.PENDING)
    return delivery


def test_a_deferral_waits_longer_each_time_up_to_a_ceiling() -> None:
    """Put off again and again, an attempt is re-read less and less often (a noisy backlog costs little)."""
    for deferred, base in [(0, 0.5), (1, 1.0), (3, 4.0), (6, DEFER_MAX_S), (40, DEFER_MAX_S)]:
        waits = [defer_s(deferred) for _ in range(50)]
        assert all(0.75 * base <= w <= 1.25 * base for w in waits), (deferred, min(waits), max(waits))


# --- end to end: a receiver that never answers ---------------------------------------------------

@pytest.mark.integration
def test_a_tenants_hanging_receiver_does_not_hold_up_another_tenants_webhook(
        cluster: Cluster, make_receiver: Callable[..., Receiver], api_server: Callable[..., Api]) -> None:
    """Tenant A's 64 runs call a receiver that takes the request and never answers, with a deadline so long
    that no such attempt ends during the test. Tenant B's run, submitted once all of A's deliveries are
    queued, gets its webhook while every one of A's attempts is still hanging, and A has at most its cap
    of attempts open (the rest wait their turn, none of them attempted yet)."""
    hang, fast = make_receiver(behaviour="hang"), make_receiver()
    cluster.env.update({"REACTQ_WEBHOOK_ALLOW_PRIVATE": "1", "REACTQ_WEBHOOK_DEADLINE_S": "900",
                        "REACTQ_WEBHOOK_CONCURRENCY": "8", "REACTQ_WEBHOOK_TENANT_IN_FLIGHT": "3"})
    cluster.start_worker(queues="steps,sandbox", concurrency=8)
    keys = make_key(cluster, "default"), make_key(cluster, "acme")
    api = api_server()
    noisy, quiet = api.client(keys[0]), api.client(keys[1])
    runs = [{"question": f"What is {i} + 1?", "webhook_url": hang.url} for i in range(64)]
    created = noisy.post("/v1/batches", json={"runs": runs})
    assert created.status_code == 201, created.text
    batch_id = created.json()["batch_id"]
    wait_for("tenant A's 64 runs to finish", lambda: noisy.get(f"/v1/batches/{batch_id}").json(), 240,
             until=lambda batch: batch["finished"] == 64, show=lambda batch: batch["finished"])
    hang.wait_for("tenant A's first attempts", lambda calls: len(calls) >= 3)

    run = quiet.post("/v1/runs", json={"question": "What is 6 * 7?", "webhook_url": fast.url})
    assert run.status_code == 201, run.text
    [call] = fast.wait_for("tenant B's webhook", lambda calls: len(calls) >= 1, timeout=120)
    assert json.loads(call.body)["run_id"] == run.json()["run_id"]
    assert not any(c.client_closed for c in hang.calls)  # every one of A's attempts is still open
    assert len(hang.calls) == 3  # A's cap; the other 61 deliveries wait their turn
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    try:
        deliveries = WebhookStore(client, keep_s=0).list("default", 100)
    finally:
        client.close()
    assert len(deliveries) == 64 and sum(not d.attempts for d in deliveries) == 64  # nothing recorded yet


# The trusted edge's resolver in the worker processes, patched (a `sitecustomize` on their PYTHONPATH, imported
# at interpreter start, before any worker module takes socket.getaddrinfo): names under .slow.invalid hang
# until the test creates the release file, as if their name server never answered. The HTTP stays real.
SLOW_DNS_EDGE = """
import os, socket, time

_real = socket.getaddrinfo


def getaddrinfo(host, port, *args, **kwargs):
    if isinstance(host, str) and host.endswith(".slow.invalid"):
        with open(os.environ["DNS_EDGE_STARTED"], "a") as started:
            started.write(host + "\\n")
        ends = time.monotonic() + 300
        while not os.path.exists(os.environ["DNS_EDGE_RELEASE"]) and time.monotonic() < ends:
            time.sleep(0.1)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return _real(host, port, *args, **kwargs)


socket.getaddrinfo = getaddrinfo
"""


@pytest.mark.integration
def test_a_tenants_unanswered_name_lookups_do_not_hold_up_another_tenants_webhook_in_the_worker(
        cluster: Cluster, make_receiver: Callable[..., Receiver], api_server: Callable[..., Api],
        tmp_path: Path) -> None:
    """Tenant A's 32 runs name hosts whose lookups never answer; its attempts end at their 2 s deadline and
    leave their lookups pending, and later ones fail at once (the tenant's cap of pending lookups). Tenant
    B's webhook, submitted then, arrives while every one of A's lookups is still hanging."""
    edge = tmp_path / "dns_edge"
    edge.mkdir()
    (edge / "sitecustomize.py").write_text(SLOW_DNS_EDGE)
    started, release = tmp_path / "lookups-started", tmp_path / "lookups-release"
    fast = make_receiver()
    cluster.env.update({"REACTQ_WEBHOOK_ALLOW_PRIVATE": "1", "REACTQ_WEBHOOK_DEADLINE_S": "2",
                        "REACTQ_WEBHOOK_CONCURRENCY": "8", "DNS_EDGE_STARTED": str(started),
                        "DNS_EDGE_RELEASE": str(release),
                        "PYTHONPATH": os.pathsep.join([str(edge), str(Path(__file__).resolve().parent.parent),
                                                       cluster.env.get("PYTHONPATH", "")])})
    try:
        cluster.start_worker(queues="steps,sandbox", concurrency=8)
        keys = make_key(cluster, "default"), make_key(cluster, "acme")
        api = api_server()
        noisy, quiet = api.client(keys[0]), api.client(keys[1])
        runs = [{"question": f"What is {i} + 1?", "webhook_url": f"http://h{i}.slow.invalid:{fast.port}/hook"}
                for i in range(32)]
        assert noisy.post("/v1/batches", json={"runs": runs}).status_code == 201
        client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
        store = WebhookStore(client, keep_s=0)

        def a_errors() -> list[str]:
            return [a.error or "" for d in store.list("default", 100) for a in d.attempts]

        try:
            wait_for("8 of A's attempts to have ended", a_errors, 180, until=lambda errors: len(errors) >= 8)
            run = quiet.post("/v1/runs", json={"question": "What is 6 * 7?", "webhook_url": fast.url})
            assert run.status_code == 201, run.text
            [call] = fast.wait_for("tenant B's webhook", lambda calls: len(calls) >= 1, timeout=120)
            assert json.loads(call.body)["run_id"] == run.json()["run_id"]
            hung = started.read_text().split()
            assert not release.exists() and 1 <= len(hung) <= 4  # A's lookups: its cap, all still hanging
            assert any("lookups of this tenant's hosts have not ended" in e for e in a_errors())  # the rest
        finally:
            client.close()
    finally:
        release.touch()


# --- in process: lanes and caps -----------------------------------------------------------------

def fair(store: WebhookStore, gates: DeliveryGates, delivery: Delivery, number: int, deadline_s: float) -> Any:
    http = WebhookHTTP(deadline_s=deadline_s)

    def make(loaded: Delivery) -> float | None:
        return attempt_loaded(store, loaded, number, http, allow_private=True, retry_base_s=1, retry_max_s=1,
                              retry_for_s=600, lookups=gates.lookups)

    return deliver_fairly(store, WebhookSlots(store.r), gates, delivery.id, number, deadline_s, make)


def in_background(call: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_first_attempts_do_not_wait_behind_retries(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    """With the retry lane (one thread here) held by a retry to a hanging receiver, another retry is put
    off at once (nothing sent, nothing recorded) and a first attempt is delivered."""
    hang, fast = make_receiver(behaviour="hang"), make_receiver()
    gates = DeliveryGates(FairShares(tenant_in_flight=10, host_in_flight=10, retry_threads=1))
    held = new_delivery(store, "t1", hang.url, failed_attempts=1)
    in_background(lambda: fair(store, gates, held, 2, deadline_s=GENEROUS_S))
    hang.wait_for("the retry in the lane", lambda calls: len(calls) == 1)

    other = new_delivery(store, "t2", fast.url, failed_attempts=2)
    put_off = fair(store, gates, other, 3, deadline_s=5)
    assert put_off is not None and (put_off.number, put_off.deferred) == (3, 1) and put_off.countdown > 0
    first = new_delivery(store, "t3", fast.url)
    assert fair(store, gates, first, 1, deadline_s=5) is None
    assert [c.answered for c in fast.calls] == [200]
    assert [d.state for d in (store.load(other.id), store.load(first.id))] == [DeliveryState.PENDING,
                                                                               DeliveryState.DELIVERED]
    assert len(store.load(other.id).attempts) == 2  # the deferral is not an attempt


def test_a_destination_host_and_a_tenant_are_capped_across_tenants(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    """Three tenants call one hanging host: two get in (the host's cap), the third is put off; a tenant at
    its own cap is put off for a new host too; a fourth tenant's webhook to another host name goes."""
    hang, fast = make_receiver(behaviour="hang"), make_receiver()
    gates = DeliveryGates(FairShares(tenant_in_flight=1, host_in_flight=2, retry_threads=4))
    for tenant in ("t1", "t2"):
        held = new_delivery(store, tenant, hang.url)
        in_background(lambda held=held: fair(store, gates, held, 1, deadline_s=GENEROUS_S))
    hang.wait_for("two attempts in flight", lambda calls: len(calls) == 2)
    third = fair(store, gates, new_delivery(store, "t3", hang.url), 1, deadline_s=5)
    assert third is not None and third.number == 1
    at_cap = fair(store, gates, new_delivery(store, "t1", fast.url.replace("127.0.0.1", "localhost")), 1, 5)
    assert at_cap is not None and at_cap.number == 1
    assert fast.calls == [] and len(hang.calls) == 2
    fourth = new_delivery(store, "t4", fast.url.replace("127.0.0.1", "localhost"))
    assert fair(store, gates, fourth, 1, deadline_s=5) is None
    assert [c.answered for c in fast.calls] == [200] and store.load(fourth.id).state == DeliveryState.DELIVERED


# --- name lookups ---------------------------------------------------------------------------------

def test_a_tenants_unanswered_name_lookups_do_not_delay_another_tenants_webhook(
        store: WebhookStore, make_receiver: Callable[..., Receiver]) -> None:
    """Tenant A's 24 webhooks name hosts whose lookups never answer (its name server hangs: the resolver at
    the trusted edge is patched to block on them); while they are pending, tenant B's webhook resolves and
    is delivered over real HTTP on its first attempt. A's lookups hold at most its cap of threads."""
    receiver = make_receiver()
    release = threading.Event()
    slow_lookups: list[str] = []

    def resolver(host: str, port: int, **options: Any) -> list:
        if host.endswith(".slow.invalid"):
            slow_lookups.append(host)
            release.wait(GENEROUS_S)
            raise socket.gaierror(socket.EAI_NONAME, "unresolvable")
        return socket.getaddrinfo("127.0.0.1", port, **options)

    def attempt(delivery: Delivery, deadline_s: float) -> None:
        attempt_delivery(store, delivery.id, 1, WebhookHTTP(deadline_s=deadline_s), allow_private=True,
                         retry_base_s=1, retry_max_s=1, retry_for_s=600, resolve=resolver)

    slow = [new_delivery(store, "slow-dns", f"http://h{i}.slow.invalid:{receiver.port}/hook") for i in range(24)]
    try:
        threads = [in_background(lambda d=d: attempt(d, 3)) for d in slow]
        wait_for("tenant A's lookups to start", lambda: len(slow_lookups), until=lambda n: n >= 4)
        quick = new_delivery(store, "quick", f"http://hooks.quick.test:{receiver.port}/hook")
        attempt(quick, 5)
        done = store.load(quick.id)
        assert done is not None and done.state == DeliveryState.DELIVERED, done
        assert [c.answered for c in receiver.calls] == [200]
        for thread in threads:
            thread.join(GENEROUS_S)
        assert len(slow_lookups) <= 4  # the tenant's cap of pending lookups; the rest failed without one
        records = [store.load(d.id) for d in slow]
        assert all(r is not None and r.attempts[0].kind == AttemptError.TIMEOUT for r in records)
    finally:
        release.set()
    wait_for("the abandoned lookups to end", lambda: UNSHARED_LOOKUPS.pending("slow-dns"), until=lambda n: n == 0)
