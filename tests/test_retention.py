"""Removing data: DELETE of a run or batch, cancelling a batch, and the operator's purge — against real
redis-server, `reactq worker` processes and the HTTP API."""

from __future__ import annotations

import json

import httpx
import pytest
import redis

from tests.fixtures_cluster import Cluster
from tests.waiting import wait_for
from worker.service.retention import parse_age


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45),
                                               ("2w", 14 * 86400), ("1.5h", 5400), (" 7D ", 7 * 86400)])
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["30", "d", "-1d", "3 days", "1y", ""])
def test_parse_age_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not an age"):
        parse_age(text)


def run_keys(url: str, run_id: str) -> list[str]:
    client = redis.Redis.from_url(url)
    found = [k.decode() for k in client.scan_iter(match=f"reactq:run:{run_id}*")]
    client.close()
    return found


@pytest.mark.integration
def test_cancel_a_batch_over_the_api_and_the_cli(cluster: Cluster, api_client: httpx.Client) -> None:
    # no worker yet: every run is still queued when the batch is cancelled
    created = api_client.post("/v1/batches", json={"runs": [{"question": f"What is {i} + {i}?"} for i in range(5)]})
    batch_id = created.json()["batch_id"]
    cancelled = api_client.post(f"/v1/batches/{batch_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json() == {"batch_id": batch_id, "cancelled": 5,
                                                                  "already_finished": 0}
    again = cluster.reactq("cancel", "--batch", batch_id, "--json")
    assert json.loads(again.stdout) == {"batch_id": batch_id, "cancelled": 0, "already_finished": 5}
    assert api_client.get(f"/v1/batches/{batch_id}").json()["statuses"] == {"cancelled": 5}
    cluster.start_worker(queues="steps")
    for run_id in created.json()["run_ids"]:  # the workers stop them at their first step
        assert cluster.wait_for_run(run_id)["steps"] == 0
    assert api_client.post("/v1/batches/b-nope/cancel").status_code == 404
    assert cluster.reactq("cancel", "--batch", "b-nope").returncode == 2


@pytest.mark.integration
def test_delete_a_run_and_a_batch_removes_every_key(cluster: Cluster, api_client: httpx.Client) -> None:
    url = cluster.env["REACTQ_REDIS_URL"]
    cluster.env["REACTQ_APPROVAL_TOOLS"] = '["calculator"]'  # the run stops half-way, its working keys all there
    cluster.start_worker(queues="steps,sandbox")
    run_id = cluster.reactq("ask", "What is 17 * 23 + 4 and what is the 30th Fibonacci number?").stdout.strip()
    stored = wait_for(f"run {run_id}'s python result", lambda: run_keys(url, run_id), 60,
                      until=lambda found: any(":obs:" in k for k in found))
    assert any(":reply:" in k for k in stored) and any(":sandbox:" in k for k in stored)
    assert api_client.get(f"/v1/runs/{run_id}").json()["status"] == "awaiting_approval"
    assert api_client.delete(f"/v1/runs/{run_id}").json() == {"deleted": run_id}
    assert run_keys(url, run_id) == []
    assert api_client.get(f"/v1/runs/{run_id}").status_code == 404

    created = api_client.post("/v1/batches", json={"runs": [{"question": "What is the capital of Japan?"},
                                                            {"question": "Who wrote Hamlet?"}]}).json()
    for run_id in created["run_ids"]:
        cluster.wait_for_run(run_id)
    deleted = api_client.delete(f"/v1/batches/{created['batch_id']}")
    assert deleted.json() == {"deleted": created["batch_id"], "runs": 2}
    assert all(run_keys(url, run_id) == [] for run_id in created["run_ids"])
    client = redis.Redis.from_url(url)
    assert list(client.scan_iter(match=f"reactq:batch:{created['batch_id']}*")) == []
    client.close()
    assert api_client.get(f"/v1/batches/{created['batch_id']}").status_code == 404

    theirs = cluster.reactq("ask", "What is 1 + 1?", "--tenant", "acme").stdout.strip()
    assert api_client.delete(f"/v1/runs/{theirs}").status_code == 404  # another tenant's run
    assert run_keys(url, theirs) != []


@pytest.mark.integration
def test_purge_removes_only_old_finished_runs(cluster: Cluster) -> None:
    url = cluster.env["REACTQ_REDIS_URL"]
    cluster.start_worker(queues="steps")
    old, recent = (json.loads(cluster.reactq("ask", q, "--wait", "--json").stdout)["run_id"]
                   for q in ("What is 3 * 3?", "What is 4 * 4?"))
    client = redis.Redis.from_url(url)
    record = json.loads(client.get(f"reactq:run:{old}"))
    record["finished_at"] -= 40 * 86400  # as if it had finished 40 days ago
    client.set(f"reactq:run:{old}", json.dumps(record), keepttl=True)
    client.close()
    assert "purged 0 run(s)" in cluster.reactq("purge", "--older-than", "60d").stdout
    report = json.loads(cluster.reactq("purge", "--older-than", "30d", "--json").stdout)
    assert report["runs"] == 1 and report["keys"] >= 3
    assert run_keys(url, old) == [] and run_keys(url, recent) != []
    bad = cluster.reactq("purge", "--older-than", "soon")
    assert bad.returncode == 2 and "not an age" in bad.stderr


@pytest.mark.integration
def test_a_finished_run_keeps_three_keys_and_its_events_still_replay_in_full(
        cluster: Cluster, api_client: httpx.Client) -> None:
    url = cluster.env["REACTQ_REDIS_URL"]
    cluster.start_worker(queues="steps,sandbox")
    run = json.loads(cluster.reactq("ask", "What is 6 * 7 and what is the 30th Fibonacci number?", "--wait",
                                    "--json").stdout)
    wanted = {f"reactq:run:{run['run_id']}", f"reactq:run:{run['run_id']}:steps", f"reactq:run:{run['run_id']}:history"}
    wait_for("the finished run's keys trimmed to three", lambda: set(run_keys(url, run["run_id"])), 30,
             until=lambda found: found == wanted)
    with api_client.stream("GET", f"/v1/runs/{run['run_id']}/events") as response:
        lines = list(response.iter_lines())
    kinds = [line.split(": ", 1)[1] for line in lines if line.startswith("event: ")]
    data = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("data: ")]
    trace = api_client.get(f"/v1/runs/{run['run_id']}", params={"trace": True}).json()["trace"]
    assert kinds == ["queued", *["step"] * len(trace), "finished"]
    assert data[1:-1] == trace  # each step event is the recorded step, in full
    ids = [line.split(": ", 1)[1] for line in lines if line.startswith("id: ")]
    with api_client.stream("GET", f"/v1/runs/{run['run_id']}/events", headers={"Last-Event-ID": ids[1]}) as response:
        resumed = [line.split(": ", 1)[1] for line in response.iter_lines() if line.startswith("id: ")]
    assert resumed == ids[2:]
