"""The HTTP API over real HTTP: `reactq api` as a process, on the test's Redis and workers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import Cluster
from worker.store import keys

pytestmark = pytest.mark.integration


@pytest.fixture
def api_keys(cluster: Cluster) -> dict[str, str]:
    """API keys of the REACTQ_TENANTS tenants `default` and `acme` (the `operator` plan)."""
    return {name: make_key(cluster, name) for name in ("default", "acme")}


@pytest.fixture
def api(cluster: Cluster, api_keys: dict[str, str]) -> Iterator[httpx.Client]:
    """A client acting as tenant `default`."""
    server = start_api(cluster)
    try:
        yield server.client(api_keys["default"])
    finally:
        server.stop()


def wait_finished(api: httpx.Client, run_id: str) -> dict:
    """Follow the run's server-sent events to the end; returns the run with its trace."""
    with api.stream("GET", f"/v1/runs/{run_id}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.split(": ", 1)[1] for line in response.iter_lines() if line.startswith("event: ")]
    run = api.get(f"/v1/runs/{run_id}", params={"trace": True}).json()
    assert events == ["queued", *["step"] * len(run["trace"]), "finished"]
    return run


def test_submit_follow_and_read_a_run(cluster: Cluster, api: httpx.Client) -> None:
    cluster.start_worker(queues="steps", concurrency=8)
    assert api.get("/healthz").json() == {"status": "ok"}
    created = api.post("/v1/runs", json={"question": "What is 17 * 23 + 4?"})
    assert created.status_code == 201 and created.json()["status"] == "queued"
    run = wait_finished(api, created.json()["run_id"])
    assert run["status"] == "succeeded" and run["answer"] == "395"
    assert [s["index"] for s in run["trace"]] == [0, 1]
    assert run["trace"][0]["tool_calls"][0]["name"] == "calculator"
    assert run["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in run["trace"])


def test_events_resume_after_last_event_id(cluster: Cluster, api: httpx.Client) -> None:
    cluster.start_worker(queues="steps", concurrency=8)
    run_id = api.post("/v1/runs", json={"question": "What is 6 * 6?"}).json()["run_id"]
    wait_finished(api, run_id)
    with api.stream("GET", f"/v1/runs/{run_id}/events") as response:
        ids = [line.split(": ", 1)[1] for line in response.iter_lines() if line.startswith("id: ")]
    with api.stream("GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": ids[1]}) as response:
        rest = [line.split(": ", 1)[1] for line in response.iter_lines() if line.startswith("id: ")]
    assert rest == ids[2:]


def test_batches_and_their_usage(cluster: Cluster, api: httpx.Client, api_keys: dict[str, str]) -> None:
    cluster.start_worker(queues="steps", concurrency=8)
    api.headers["Authorization"] = f"Bearer {api_keys['acme']}"
    questions = ["What is 2 + 2?", "What is the capital of France?", "What is 9 * 9?"]
    created = api.post("/v1/batches", json={"runs": [{"question": q} for q in questions], "tenant": "acme"})
    assert created.status_code == 201
    batch_id, run_ids = created.json()["batch_id"], created.json()["run_ids"]
    runs = [wait_finished(api, run_id) for run_id in run_ids]
    batch = api.get(f"/v1/batches/{batch_id}").json()
    assert batch["size"] == 3 and batch["finished"] == 3 and batch["statuses"] == {"succeeded": 3}
    assert batch["usage"]["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in runs)
    assert batch["usage"]["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in runs)
    assert all(r["tenant"] == "acme" for r in runs)
    tenant = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"]).hgetall(keys.tenant_usage("acme"))
    assert int(tenant[b"prompt_tokens"]) == batch["usage"]["prompt_tokens"]
    assert int(tenant[b"completion_tokens"]) == batch["usage"]["completion_tokens"]


def test_errors_are_json_with_a_clear_message(cluster: Cluster, api: httpx.Client) -> None:
    cases = [
        (api.post("/v1/runs", json={"question": ""}), 422, "question is empty"),
        (api.post("/v1/runs", json={"question": "hi", "tier": "gold"}), 422, "unknown tier 'gold'"),
        (api.post("/v1/runs", json={"question": "hi", "tenant": "evil"}), 403, "the tenant comes from your API key"),
        (api.post("/v1/runs", json={"questoin": "hi"}), 422, "question"),
        (api.post("/v1/runs", content=b"{not json", headers={"content-type": "application/json"}), 422, "JSON"),
        (api.post("/v1/batches", json={"runs": []}), 422, "runs"),
        (api.get("/v1/runs/nope"), 404, "no run 'nope'"),
        (api.get("/v1/batches/nope"), 404, "no batch 'nope'"),
        (api.post("/v1/runs/nope/cancel"), 404, "no run 'nope'"),
        (api.get("/v1/nothing-here"), 404, "Not Found"),
        (api.delete("/v1/runs"), 405, "Method Not Allowed"),
    ]
    for response, status, text in cases:
        assert response.status_code == status, response.text
        assert text in response.json()["error"]["message"], response.text


def test_cancel_over_http(cluster: Cluster, api: httpx.Client, stub_control) -> None:
    stub_control.set_faults(latency_ms=2000)
    cluster.start_worker(queues="steps", concurrency=4)
    run_id = api.post("/v1/runs", json={"question": "What is 6 * 7?"}).json()["run_id"]
    cancelled = api.post(f"/v1/runs/{run_id}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert api.post(f"/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"  # idempotent
    assert wait_finished(api, run_id)["status"] == "cancelled"


def test_metrics_endpoint(cluster: Cluster, api: httpx.Client) -> None:
    text = api.get("/metrics").text
    assert "reactq_queue_depth" in text and "reactq_runs_in_progress" in text
