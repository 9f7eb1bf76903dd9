"""Human approval against real redis-server and real `reactq worker` processes: a run pauses in
`awaiting_approval` without holding a worker slot, survives a worker restart while waiting, and goes on
when approved (CLI) or rejected (HTTP API); an unanswered call expires and ends the run."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import redis

from tests.fixtures_cluster import Cluster
from tests.fixtures_prometheus import scrape, total
from tests.fixtures_services import free_port
from tests.waiting import wait_for
from worker.store import keys

pytestmark = pytest.mark.integration
CALCULATOR_NEEDS_APPROVAL = {"REACTQ_APPROVAL_TOOLS": '["calculator"]'}


def wait_status(cluster: Cluster, run_id: str, status: str, timeout: float = 120) -> dict:
    shown = cluster.wait_for_status(run_id, lambda s: s == status, f"in status {status!r}", timeout)
    assert shown["status"] == status, shown
    return shown


def event_kinds(redis_url: str, run_id: str) -> list[str]:
    """A finished run's event types (its stream is compacted into one JSON string once it ends)."""
    client = redis.Redis.from_url(redis_url)
    raw = client.get(keys.events_compacted(run_id))
    client.close()
    assert raw is not None, f"run {run_id} has no compacted events"
    return [kind for _, kind, _ in json.loads(raw)]


def test_approved_across_a_worker_restart_without_holding_a_slot(cluster: Cluster) -> None:
    cluster.env.update(CALCULATOR_NEEDS_APPROVAL)
    worker = cluster.start_worker(queues="steps,sandbox", concurrency=1)
    run_id = cluster.reactq("ask", "What is 6 * 7?").stdout.strip()
    run = wait_status(cluster, run_id, "awaiting_approval")
    [pending] = run["approvals"]
    assert pending["tool"] == "calculator" and pending["arguments"] == {"expression": "6 * 7"}
    assert pending["decision"] is None and run["waiting_on"] == "approval"
    trace = cluster.reactq("trace", run_id, COLUMNS="400").stdout
    assert "PENDING calculator" in trace and f"reactq approve {run_id} {pending['call_id']}" in trace

    # the only worker thread is free: another run (no approval needed) goes through meanwhile
    other = cluster.reactq("ask", "What is the capital of France?", "--wait")
    assert other.returncode == 0 and "Paris" in other.stdout

    cluster.kill(worker)
    decided = cluster.reactq("approve", run_id, pending["call_id"], "--json")
    assert decided.returncode == 0, decided.stderr
    assert json.loads(decided.stdout)["status"] == "running"
    cluster.start_worker(queues="steps,sandbox", concurrency=1)
    done = cluster.wait_for_run(run_id)
    assert done["status"] == "succeeded" and done["answer"] == "42"
    [approval] = done["approvals"]
    assert approval["decision"] == "approved" and approval["decided_by"].startswith("cli:")
    assert approval["requested_at"] <= approval["decided_at"] <= time.time()
    trace_json = json.loads(cluster.reactq("trace", run_id, "--json").stdout)
    assert trace_json["trace"][0]["observations"][0]["content"] == "42"
    assert "APPROVED calculator" in cluster.reactq("trace", run_id, COLUMNS="400").stdout
    kinds = event_kinds(cluster.env["REACTQ_REDIS_URL"], run_id)
    assert kinds.index("approval_requested") < kinds.index("approval_decided") < kinds.index("finished")

    again = cluster.reactq("approve", run_id)
    assert again.returncode == 2 and "not awaiting approval" in again.stderr


def test_rejected_over_the_api_becomes_an_observation_and_is_counted(
        cluster: Cluster, api_client: httpx.Client) -> None:
    cluster.env.update(CALCULATOR_NEEDS_APPROVAL)
    port = free_port()
    cluster.start_worker(queues="steps,sandbox", metrics_port=port)
    run_id = api_client.post("/v1/runs", json={"question": "What is 17 * 23 + 4?"}).json()["run_id"]
    [pending] = wait_status(cluster, run_id, "awaiting_approval")["approvals"]
    assert api_client.get(f"/v1/runs/{run_id}").json()["approvals"][0]["call_id"] == pending["call_id"]
    wrong = api_client.post(f"/v1/runs/{run_id}/approvals", json={"decision": "reject", "call_id": "nope"})
    assert wrong.status_code == 409 and "no pending call 'nope'" in wrong.json()["error"]["message"]
    assert api_client.post("/v1/runs/unknown/approvals", json={"decision": "approve"}).status_code == 404
    response = api_client.post(f"/v1/runs/{run_id}/approvals",
                               json={"decision": "reject", "reason": "no arithmetic on Sundays"})
    assert response.status_code == 200, response.text
    done = cluster.wait_for_run(run_id)
    assert done["status"] == "succeeded"
    observation = api_client.get(f"/v1/runs/{run_id}", params={"trace": True}).json()["trace"][0]["observations"][0]
    assert observation["outcome"] == "refused" and "no arithmetic on Sundays" in observation["content"]
    [approval] = done["approvals"]
    assert approval["decision"] == "rejected" and approval["decided_by"] == "api:default"
    wait_for("reactq_approvals_total{outcome=rejected} == 1",
             lambda: total(scrape(f"http://127.0.0.1:{port}/metrics"), "reactq_approvals_total", outcome="rejected"),
             20, until=lambda rejected: rejected == 1)


def test_an_unanswered_call_expires_and_ends_the_run(cluster: Cluster) -> None:
    cluster.env.update({**CALCULATOR_NEEDS_APPROVAL, "REACTQ_APPROVAL_TIMEOUT_S": "1"})
    cluster.start_worker(queues="steps,sandbox")
    run_id = cluster.reactq("ask", "What is 6 * 7?").stdout.strip()
    done = wait_status(cluster, run_id, "timeout")
    assert "approval of calculator" in done["error"] and "not given within 1 s" in done["error"]
    assert done["approvals"][0]["decision"] == "expired"
