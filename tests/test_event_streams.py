"""Event streams (`GET /v1/runs/{id}/events`) under hostile load, over real HTTP against a real `reactq api`
process and redis-server: streams have their own Redis pool and a per-process cap, so one tenant's streams
do not hold up another tenant's requests; a revoked key's (or a removed tenant's) open stream ends; the SSE
headers and keep-alive comments are sent. No worker runs: every run stays queued, its stream open."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import httpx
import pytest
import redis

from tests.fixtures_api import Api, make_key
from tests.fixtures_cluster import Cluster, wait_until
from worker.store.tenant_records import TenantStore
from worker.tenancy.tenants import Tenants

pytestmark = pytest.mark.integration


def open_stream(stack: ExitStack, client: httpx.Client, run_id: str) -> Iterator[str]:
    """The stream's lines, once its headers said 200."""
    response = stack.enter_context(client.stream("GET", f"/v1/runs/{run_id}/events", timeout=60))
    assert response.status_code == 200, response.read()
    return response.iter_lines()


def next_event(lines: Iterator[str]) -> str:
    """The type of the stream's next event (comments skipped)."""
    return next(line.split(": ", 1)[1] for line in lines if line.startswith("event: "))


def submit(client: httpx.Client) -> str:
    created = client.post("/v1/runs", json={"question": "What is 2 + 2?"})
    assert created.status_code == 201, created.text
    return str(created.json()["run_id"])


def test_sse_headers_and_keep_alive_comments(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "watcher", "standard")
    client = api_server().client(key)
    run_id = submit(client)
    with client.stream("GET", f"/v1/runs/{run_id}/events", timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        lines = response.iter_lines()
        assert next_event(lines) == "queued"
        comment = next(line for line in lines if line.startswith(":"))
    assert comment.strip(": ")  # a keep-alive comment, sent while the run waits
    bad = client.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "not-an-id"})
    assert bad.status_code == 422 and "Last-Event-ID" in bad.json()["error"]["message"]


def test_streams_do_not_starve_other_callers_and_are_capped_per_process(
        tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    """The smallest Redis pool for the API's other reads (8) and as many streams as that, from one tenant: the
    other tenant's requests still answer (with a shared pool, its auth waited 30 s and failed 503)."""
    c = tenancy_cluster
    c.env.update(REACTQ_REDIS_MAX_CONNECTIONS="8", REACTQ_SSE_MAX_STREAMS_PER_PROCESS="8")
    streamer_key, other_key = make_key(c, "streamer", "standard"), make_key(c, "bystander", "standard")
    api = api_server()
    streamer, other = api.client(streamer_key), api.client(other_key)
    runs = [submit(streamer) for _ in range(9)]
    theirs = submit(other)
    with ExitStack() as stack:
        streams = [open_stream(stack, streamer, run_id) for run_id in runs[:8]]
        assert [next_event(lines) for lines in streams] == ["queued"] * 8  # all 8 are open and reading
        for _ in range(3):
            usage = other.get("/v1/usage", timeout=60)
            assert usage.status_code == 200 and usage.json()["tenant"] == "bystander", usage.text
            assert other.get(f"/v1/runs/{theirs}", timeout=60).status_code == 200
        capped = other.get(f"/v1/runs/{theirs}/events", timeout=60)
        assert capped.status_code == 429 and int(capped.headers["Retry-After"]) > 0, capped.text
        assert "REACTQ_SSE_MAX_STREAMS_PER_PROCESS" in capped.json()["error"]["message"]
    # the places are given back once the server sees the streams closed (at its next keep-alive)
    wait_until(lambda: _stream_opens(other, theirs), "a place for a stream once the 8 have closed", 60, interval=0.5)


def _stream_opens(client: httpx.Client, run_id: str) -> bool:
    with client.stream("GET", f"/v1/runs/{run_id}/events", timeout=60) as response:
        return response.status_code == 200 and next_event(response.iter_lines()) == "queued"


def test_an_open_stream_ends_when_its_key_is_revoked_or_its_tenant_removed(
        tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    revoked_key, removed_key = make_key(c, "revoked", "standard"), make_key(c, "removed", "standard")
    api = api_server()
    revoked, removed = api.client(revoked_key), api.client(removed_key)
    run_a, run_b = submit(revoked), submit(removed)
    with ExitStack() as stack:
        lines_a, lines_b = open_stream(stack, revoked, run_a), open_stream(stack, removed, run_b)
        assert next_event(lines_a) == next_event(lines_b) == "queued"

        client = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
        tenants = Tenants(TenantStore(client), c.settings())
        [listed] = tenants.list_keys("revoked")
        tenants.revoke(str(listed["key_id"]))
        client.close()
        rest_a = list(lines_a)  # the stream ends by itself
        assert "event: error" in rest_a, rest_a
        data = json.loads(rest_a[rest_a.index("event: error") + 1].removeprefix("data: "))
        assert data["error"] == {"message": "this API key has been revoked",
                                                             "status": 403}, rest_a

        gone = c.reactq("tenant", "remove", "removed")
        assert gone.returncode == 0, gone.stderr
        assert "1 API key(s) revoked, 1 unfinished run(s) cancelled" in gone.stdout
        rest_b = list(lines_b)
        assert "event: finished" in rest_b or "event: error" in rest_b, rest_b
    assert revoked.get(f"/v1/runs/{run_a}").status_code == 403
    assert removed.get(f"/v1/runs/{run_b}").status_code == 403
    assert c.load_run(run_b).status == "cancelled"  # type: ignore[union-attr]
    listed_tenants = [t["tenant"] for t in json.loads(c.reactq("tenant", "list", "--json").stdout)]
    assert "removed" not in listed_tenants and "revoked" in listed_tenants
    # its keys are listed by its id (the name is free for a new tenant, which has none)
    removed_id = re.search(r"\(id (\S+)\)", gone.stdout)[1]  # type: ignore[index]
    assert removed_id.startswith("removed.")
    assert json.loads(c.reactq("key", "list", removed_id, "--json").stdout)[0]["revoked_at"]
    assert json.loads(c.reactq("key", "list", "removed", "--json").stdout) == []
    unknown = c.reactq("tenant", "remove", "nobody")
    assert unknown.returncode == 2 and "unknown tenant 'nobody'" in unknown.stderr
