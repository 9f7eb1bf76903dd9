"""Webhooks: URL validation and signing (pure), then delivery end to end — real redis-server, real
`reactq worker` processes, a real local receiver that fails its first calls, the real HTTP API."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from tests.fixtures_api import Api, make_key
from tests.fixtures_cluster import Cluster
from tests.fixtures_receiver import HUGE_BODY, Receiver
from tests.waiting import wait_for
from worker.errors import InvalidRequest
from worker.runtime.webhooks import backoff_s, validate_url, verify
from worker.store.webhooks import WebhookStore

# --- pure --------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://example.com/hook", "https://example.com:8443/a?b=c", "http://10.0.0.1/x"])
def test_valid_urls(url: str) -> None:
    assert validate_url(url) == url


@pytest.mark.parametrize(("url", "problem"), [
    ("ftp://example.com/", "http or https"),
    ("file:///etc/passwd", "http or https"),
    ("example.com/hook", "http or https"),
    ("http:///nohost", "no host"),
    ("http://user:pw@example.com/", "credentials"),
    ("http://example.com:99999/", "not a valid URL"),
    ("http://example.com/" + "a" * 2000, "longer than"),
])
def test_invalid_urls(url: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        validate_url(url)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n, 10, 100) for n in range(1, 7)] == [10, 20, 40, 80, 100, 100]


# --- end to end --------------------------------------------------------------------------------

FAST_RETRIES = {"REACTQ_WEBHOOK_ALLOW_PRIVATE": "1", "REACTQ_WEBHOOK_RETRY_BASE_S": "0.3",
                "REACTQ_WEBHOOK_RETRY_MAX_S": "1"}


def wait_delivery(cluster: Cluster, state: str, count: int = 1, timeout: float = 120) -> list[dict]:
    """The tenant's deliveries once `count` of them are in `state`."""
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    store = WebhookStore(client, keep_s=0)  # read only; polled in-process (a CLI call per poll costs a CPU second)
    try:
        wait_for(f"{count} delivery in state {state!r}", lambda: [d.public() for d in store.list("default", 20)],
                 timeout, until=lambda polled: sum(d["state"] == state for d in polled) >= count)
    finally:
        client.close()
    shown = cluster.reactq("webhook", "deliveries", "--json")
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert sum(d["state"] == state for d in found) >= count, found
    return found


@pytest.mark.integration
def test_tenant_default_webhook_retried_until_delivered_and_signed(
        cluster: Cluster, make_receiver: Callable[[int], Receiver], api_client: httpx.Client) -> None:
    receiver = make_receiver(2)  # two 500s, then 200
    cluster.env.update(FAST_RETRIES)
    cluster.start_worker(queues="steps,sandbox")  # step workers consume reactq.webhooks by default
    assert cluster.reactq("webhook", "set-default", "default", receiver.url).returncode == 0
    secret = cluster.reactq("webhook", "secret", "default").stdout.strip()
    done = cluster.reactq("ask", "What is 6 * 7?", "--wait", "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    calls = receiver.wait_for("a call answered 200", lambda c: any(x.answered == 200 for x in c))
    assert [c.answered for c in calls] == [500, 500, 200]
    assert len({c.headers["x-reactq-delivery"] for c in calls}) == 1  # one idempotency id for all attempts
    for call in calls:
        assert call.headers["x-reactq-event"] == "run.finished"
        timestamp = call.headers["x-reactq-timestamp"]
        expected = "v1=" + hmac.new(secret.encode(), timestamp.encode() + b"." + call.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(call.headers["x-reactq-signature"], expected)
        verify(secret, call.body, timestamp, call.headers["x-reactq-signature"])
    body = json.loads(calls[-1].body)
    assert body == json.loads(cluster.reactq("status", run["run_id"], "--json").stdout)
    assert body["status"] == "succeeded" and body["answer"] == "42"

    [delivery] = wait_delivery(cluster, "delivered")
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 200]
    assert [a["error"] for a in delivery["attempts"]] == ["HTTP 500", "HTTP 500", None]
    assert [a["kind"] for a in delivery["attempts"]] == ["http_status", "http_status", None]
    listed = api_client.get("/v1/webhooks/deliveries").json()["deliveries"]
    assert [d["id"] for d in listed] == [delivery["id"]] and "body" not in listed[0]


@pytest.mark.integration
def test_batch_webhook_and_a_failing_receiver_never_affect_the_runs(
        cluster: Cluster, make_receiver: Callable[[int], Receiver], api_client: httpx.Client) -> None:
    batch_receiver, broken = make_receiver(0), make_receiver(-1)  # the second always answers 500
    cluster.env.update({**FAST_RETRIES, "REACTQ_WEBHOOK_RETRY_FOR_S": "2"})
    cluster.start_worker(queues="steps,sandbox")
    created = api_client.post("/v1/batches", json={"webhook_url": batch_receiver.url, "runs": [
        {"question": "What is 2 + 2?", "webhook_url": broken.url},
        {"question": "What is the capital of France?"},
    ]})
    assert created.status_code == 201, created.text
    batch_id = created.json()["batch_id"]
    [call] = batch_receiver.wait_for("the batch's call", lambda c: len(c) >= 1)
    assert call.headers["x-reactq-event"] == "batch.finished"
    body = json.loads(call.body)
    got = api_client.get(f"/v1/batches/{batch_id}").json()
    assert got["run_ids"] == created.json()["run_ids"] and got["next_offset"] is None
    assert body == {k: v for k, v in got.items() if k not in ("run_ids", "next_offset")}  # no id list
    assert body["finished"] == 2 and body["statuses"] == {"succeeded": 2} and body["unfinished"] == 0
    assert body["runs_url"] == f"/v1/runs?batch_id={batch_id}"
    page = api_client.get(f"/v1/batches/{batch_id}", params={"limit": 1}).json()
    assert page["run_ids"] == created.json()["run_ids"][:1] and page["next_offset"] == 1
    page = api_client.get(f"/v1/batches/{batch_id}", params={"offset": 1, "limit": 1}).json()
    assert page["run_ids"] == created.json()["run_ids"][1:] and page["next_offset"] is None
    in_batch = api_client.get(body["runs_url"]).json()["runs"]
    assert sorted(r["run_id"] for r in in_batch) == sorted(created.json()["run_ids"])
    found = wait_delivery(cluster, "failed")  # the broken receiver's run webhook, given up after 2 s
    failed = [d for d in found if d["state"] == "failed"]
    assert failed[0]["url"] == broken.url and len(failed[0]["attempts"]) >= 2
    assert all(a["status_code"] == 500 for a in failed[0]["attempts"])
    assert len(broken.calls) == len(failed[0]["attempts"])
    run_ids = created.json()["run_ids"]
    assert all(api_client.get(f"/v1/runs/{r}").json()["status"] == "succeeded" for r in run_ids)


@pytest.mark.integration
def test_private_addresses_are_refused_unless_the_operator_allows_them(
        cluster: Cluster, make_receiver: Callable[[int], Receiver]) -> None:
    receiver = make_receiver(0)
    cluster.start_worker(queues="steps,sandbox")  # REACTQ_WEBHOOK_ALLOW_PRIVATE unset: the default
    done = cluster.reactq("ask", "What is 1 + 1?", "--wait", "--webhook-url", receiver.url)
    assert done.returncode == 0, done.stderr
    [delivery] = wait_delivery(cluster, "failed")
    [attempt] = delivery["attempts"]
    assert "non-public address" in attempt["error"] and attempt["status_code"] is None
    assert attempt["kind"] == "refused_address" and attempt["address"] == "127.0.0.1"
    assert receiver.calls == []


@pytest.mark.integration
def test_bad_webhook_urls_are_rejected_at_submission(cluster: Cluster, api_client: httpx.Client) -> None:
    response = api_client.post("/v1/runs", json={"question": "What is 1 + 1?", "webhook_url": "ftp://x/"})
    assert response.status_code == 422 and "http or https" in response.json()["error"]["message"]
    response = api_client.post("/v1/batches", json={"webhook_url": "gopher://x", "runs": [{"question": "hi"}]})
    assert response.status_code == 422
    done = cluster.reactq("webhook", "set-default", "default", "file:///etc/passwd")
    assert done.returncode == 2 and "http or https" in done.stderr


# --- hostile receivers against a real worker -----------------------------------------------------

def webhook_workers_of(step_worker: subprocess.Popen[bytes]) -> list[int]:
    """The pids of the webhook workers a step worker started beside itself (worker/runtime/webhook_pool.py)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if ppid == step_worker.pid and b"webhooks" in cmdline:
            found.append(int(stat.parent.name))
    return found


def webhook_worker_of(step_worker: subprocess.Popen[bytes]) -> int:
    return wait_for("the step worker's webhook worker", lambda: webhook_workers_of(step_worker), 60,
                    until=lambda pids: len(pids) == 1)[0]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.integration
def test_webhooks_to_dripping_receivers_never_hold_up_another_tenants_runs(
        cluster: Cluster, make_receiver: Callable[..., Receiver], api_server: Callable[..., Api]) -> None:
    """30 runs of one tenant whose webhooks go to a receiver that answers 200 and then drips a byte a second,
    with a deadline long enough that every such attempt is still open when the test ends; on a worker of 4
    step threads another tenant's 5 plain runs still finish, and the webhook worker holds only its own 2."""
    drip = make_receiver(behaviour="drip")
    cluster.env.update({"REACTQ_WEBHOOK_ALLOW_PRIVATE": "1", "REACTQ_WEBHOOK_DEADLINE_S": "900",
                        "REACTQ_WEBHOOK_CONCURRENCY": "2"})
    cluster.start_worker(queues="steps,sandbox", concurrency=4)
    keys = make_key(cluster, "default"), make_key(cluster, "acme")
    api = api_server()
    noisy, quiet = api.client(keys[0]), api.client(keys[1])
    runs = [{"question": f"What is {i} + 1?", "webhook_url": drip.url} for i in range(30)]
    assert noisy.post("/v1/batches", json={"runs": runs}).status_code == 201
    drip.wait_for("two deliveries in flight", lambda calls: len(calls) >= 2)
    plain = quiet.post("/v1/batches", json={"runs": [{"question": f"What is {i} * 3?"} for i in range(5)]})
    assert plain.status_code == 201, plain.text
    for run_id in plain.json()["run_ids"]:
        assert cluster.wait_for_run(run_id)["status"] == "succeeded"
    assert len(drip.calls) == 2 and not any(call.client_closed for call in drip.calls)  # still dripping


@pytest.mark.integration
def test_huge_answers_do_not_grow_the_webhook_worker(
        cluster: Cluster, make_receiver: Callable[..., Receiver], api_client: httpx.Client) -> None:
    """Receivers streaming a terabyte after their 200: each attempt reads the 64 KiB cap and closes, so the
    receiver gets a few buffers' worth into the socket and the webhook worker's memory stays put."""
    huge = make_receiver(behaviour="huge")
    cluster.env.update({"REACTQ_WEBHOOK_ALLOW_PRIVATE": "1", "REACTQ_WEBHOOK_CONCURRENCY": "4"})
    step_worker = cluster.start_worker(queues="steps,sandbox", concurrency=8)
    pid = webhook_worker_of(step_worker)

    def submit(count: int) -> None:
        runs = [{"question": f"What is {i} + 2?", "webhook_url": huge.url} for i in range(count)]
        assert api_client.post("/v1/batches", json={"runs": runs}).status_code == 201

    submit(1)  # warms the webhook worker up (imports, connections)
    wait_delivery(cluster, "delivered", 1)
    before = rss_bytes(pid)
    submit(12)
    found = wait_delivery(cluster, "delivered", 13)
    grown = rss_bytes(pid) - before
    assert grown < 48 * 1024 * 1024, f"the webhook worker grew by {grown} bytes"
    attempts = [a for d in found for a in d["attempts"]]
    assert len(attempts) == 13 and all(64 * 1024 <= a["response_bytes"] <= 128 * 1024 for a in attempts)
    calls = huge.wait_for("every connection closed", lambda c: len(c) == 13 and all(x.client_closed for x in c))
    assert sum(call.sent for call in calls) < 13 * 64 * 1024 * 1024 < HUGE_BODY


@pytest.mark.integration
def test_the_webhook_worker_stops_with_its_step_worker(cluster: Cluster) -> None:
    """SIGKILL of the step worker alone (not its process group): the webhook worker it started notices its
    parent is gone and stops; with REACTQ_WEBHOOK_CONCURRENCY=0 a step worker starts none."""
    step_worker = cluster.start_worker(queues="steps", concurrency=2)
    pid = webhook_worker_of(step_worker)
    os.kill(step_worker.pid, signal.SIGKILL)
    step_worker.wait(10)
    cluster.stopped.add(step_worker.pid)
    wait_for("the orphaned webhook worker to stop", lambda: alive(pid), 60, until=lambda up: not up)

    lone = cluster.start_worker(queues="steps", concurrency=2, REACTQ_WEBHOOK_CONCURRENCY="0")
    assert webhook_workers_of(lone) == []  # it would have been started before the step worker consumed
