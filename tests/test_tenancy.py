"""Tenants for real, over real HTTP: `reactq api` and `reactq worker` processes on a real Redis, tenants
and keys made with the real CLI. Keys, ownership, tiers, budgets, admission, tool permissions, errors."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from tests.fixtures_api import Api, make_key, start_api
from tests.fixtures_cluster import Cluster, state_client, wait_until
from tests.fixtures_services import RedisServer
from worker.store import keys
from worker.store.tenant_records import TenantStore
from worker.tenancy.tenants import Tenants

pytestmark = pytest.mark.integration

TWO_STEPS = "What is 3 + 4 and what is the capital of France?"


def wait_finished(client: httpx.Client, run_id: str, timeout: float = 120) -> dict:
    """Follow the run's events to `finished`; returns the run with its trace."""
    with client.stream("GET", f"/v1/runs/{run_id}/events", timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        kinds = [line.split(": ", 1)[1] for line in response.iter_lines() if line.startswith("event: ")]
    assert kinds[-1] == "finished", f"run {run_id}'s events ended without `finished`: {kinds}"
    return client.get(f"/v1/runs/{run_id}", params={"trace": True}).json()


def test_keys_authenticate_and_a_revoked_key_stops_at_once(tenancy_cluster: Cluster,
                                                          api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    refused = c.reactq("api", "--port", "1")
    assert refused.returncode == 2 and "no tenant has been set up" in refused.stderr
    created = c.reactq("tenant", "add", "alpha", "--plan", "standard")
    assert created.returncode == 0, created.stderr
    printed = c.reactq("key", "create", "alpha")
    key = printed.stdout.strip().splitlines()[-1]
    assert printed.returncode == 0 and key.startswith("rq_")
    stored = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    assert not any(key.encode() in (stored.dump(k) or b"") for k in stored.keys("*")), "the key is stored in clear"
    api = api_server()

    assert api.client(None).get("/v1/runs").status_code == 401
    assert api.client("rq_0123456789abcdef_" + "x" * 43).get("/v1/runs").status_code == 401
    assert api.client(key[:-1] + ("A" if key[-1] != "A" else "B")).get("/v1/runs").status_code == 401
    assert api.client(None).get("/healthz").json() == {"status": "ok"}
    assert "reactq_queue_depth" in api.client(None).get("/metrics").text  # scrapers need no key
    alpha = api.client(key)
    assert alpha.get("/v1/runs").status_code == 200

    [listed] = json.loads(c.reactq("key", "list", "alpha", "--json").stdout)
    assert c.reactq("key", "revoke", listed["key_id"]).returncode == 0
    revoked = alpha.get("/v1/runs")
    assert revoked.status_code == 403 and "revoked" in revoked.json()["error"]["message"]
    assert json.loads(c.reactq("key", "list", "alpha", "--json").stdout)[0]["revoked_at"]
    tenants = json.loads(c.reactq("tenant", "list", "--json").stdout)
    assert {"tenant": "alpha", "id": tenant_id(c, "alpha"), "plan": "standard", "overrides": {}, "keys": 1} in tenants


def test_another_tenants_runs_and_batches_answer_404(tenancy_cluster: Cluster,
                                                     api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    a_key, b_key = make_key(c, "tenant-a", "standard"), make_key(c, "tenant-b", "standard")
    api = api_server()
    a, b = api.client(a_key), api.client(b_key)
    run_id = b.post("/v1/runs", json={"question": "What is 2 + 2?"}).json()["run_id"]
    batch = b.post("/v1/batches", json={"runs": [{"question": "What is 1 + 1?"}, {"question": "What is 5 * 5?"}]})
    batch_id = batch.json()["batch_id"]

    unknown_run, unknown_batch = "0" * 32, "b-" + "0" * 16
    for path, unknown in [(f"/v1/runs/{run_id}", f"/v1/runs/{unknown_run}"),
                          (f"/v1/runs/{run_id}/events", f"/v1/runs/{unknown_run}/events"),
                          (f"/v1/batches/{batch_id}", f"/v1/batches/{unknown_batch}")]:
        theirs, missing = a.get(path), a.get(unknown)
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json()["error"]["message"] == missing.json()["error"]["message"].replace(
            unknown_run if "runs" in path else unknown_batch, run_id if "runs" in path else batch_id)
    assert a.post(f"/v1/runs/{run_id}/cancel").status_code == 404
    assert b.get(f"/v1/runs/{run_id}").json()["status"] == "queued"  # A's cancel did nothing
    assert a.get("/v1/runs").json() == {"runs": [], "next_cursor": None}

    mine = [b.post("/v1/runs", json={"question": f"What is {i} + {i}?"}).json()["run_id"] for i in range(3)]
    seen, cursor = [], None
    while True:
        page = b.get("/v1/runs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [r["run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen[:3] == mine[::-1] and len(seen) == 6 and len(set(seen)) == 6  # newest first, each once
    in_batch = b.get("/v1/runs", params={"batch_id": batch_id}).json()["runs"]
    assert sorted(r["run_id"] for r in in_batch) == sorted(batch.json()["run_ids"])
    assert b.get("/v1/runs", params={"status": "succeeded"}).json()["runs"] == []


def test_tier_comes_from_the_plan(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    api = api_server_with(c, api_server, free="free")
    free = api.client(c.env["TEST_KEY_free"])
    refused = free.post("/v1/runs", json={"question": "What is 2 + 2?", "tier": "pro"})
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == "tier 'pro' is not allowed on plan 'free'; allowed tiers: free"
    batch = free.post("/v1/batches", json={"runs": [{"question": "hi"}], "tier": "standard"})
    assert batch.status_code == 403 and "allowed tiers: free" in batch.text
    assert free.post("/v1/runs", json={"question": "What is 2 + 2?"}).json()["tier"] == "free"
    assert free.post("/v1/runs", json={"question": "hi", "tenant": "default"}).status_code == 403
    cli = c.reactq("ask", "What is 2 + 2?", "--tenant", "free", "--tier", "pro")
    assert cli.returncode == 2 and "not allowed on plan 'free'" in cli.stderr


def tenant_id(c: Cluster, name: str) -> str:
    """The id the tenant named `name` has now (its data is stored under it)."""
    client = state_client(c.env["REACTQ_REDIS_URL"])
    try:
        return Tenants(TenantStore(client), c.settings()).resolve(name)
    finally:
        client.close()


def api_server_with(c: Cluster, api_server: Callable[..., Api], **tenants: str) -> Api:
    """Tenants name -> plan, their keys in c.env["TEST_KEY_<name>"], then the API."""
    for name, plan in tenants.items():
        c.env[f"TEST_KEY_{name}"] = make_key(c, name, plan)
    return api_server()


def test_run_budgets_end_runs_before_a_call_could_overshoot(tenancy_cluster: Cluster,
                                                            api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    api = api_server_with(c, api_server, std="standard")
    c.start_worker(queues="steps", concurrency=8)
    client = api.client(c.env["TEST_KEY_std"])
    full = wait_finished(client, client.post("/v1/runs", json={"question": TWO_STEPS}).json()["run_id"])
    assert full["status"] == "succeeded" and len(full["trace"]) == 2
    first = full["trace"][0]["usage"]
    budget = first["prompt_tokens"] + first["completion_tokens"] + 200  # room for step 0, not for step 1

    capped = wait_finished(client, client.post("/v1/runs", json={"question": TWO_STEPS,
                                                                 "max_tokens": budget}).json()["run_id"])
    assert capped["status"] == "budget_exceeded", capped
    assert f"max_tokens={budget}" in capped["error"] and "tokens used" in capped["error"]
    assert len(capped["trace"]) == 1
    assert capped["usage"]["prompt_tokens"] + capped["usage"]["completion_tokens"] <= budget

    cheap = wait_finished(client, client.post("/v1/runs", json={"question": TWO_STEPS,
                                                                "max_cost_usd": 0.00001}).json()["run_id"])
    assert cheap["status"] == "budget_exceeded" and "max_cost_usd=1e-05" in cheap["error"]
    assert cheap["trace"] == [] and cheap["cost_usd"] == 0


def test_tenant_daily_budget_ends_runs_and_then_refuses_submissions(tenancy_cluster: Cluster,
                                                                    api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    c.env["REACTQ_LLM_MAX_TOKENS"] = "100"  # so a call reserves ~prompt + 100
    api = api_server_with(c, api_server, frugal="standard")
    daily = 2000
    assert c.reactq("tenant", "set", "frugal", "--tokens-per-day", str(daily)).returncode == 0
    c.start_worker(queues="steps", concurrency=8)
    client = api.client(c.env["TEST_KEY_frugal"])
    batch = client.post("/v1/batches", json={"runs": [{"question": TWO_STEPS}] * 3}).json()
    runs = [wait_finished(client, run_id) for run_id in batch["run_ids"]]
    ended = [r for r in runs if r["status"] == "budget_exceeded"]
    assert ended and all("tokens per day budget" in r["error"] and f"of {daily})" in r["error"] for r in ended)
    spent = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in runs)
    usage = client.get("/v1/usage").json()
    assert usage["day"]["tokens_budget"] == daily and usage["tenant"] == "frugal"
    assert spent <= usage["day"]["tokens"] <= daily  # settled; nothing reserved is left over

    # lowered to what is spent: the tenant is over its budget until midnight UTC
    assert c.reactq("tenant", "set", "frugal", "--tokens-per-day", str(usage["day"]["tokens"])).returncode == 0
    refused = client.post("/v1/runs", json={"question": "What is 2 + 2?"})
    assert refused.status_code == 429, refused.text
    midnight = (int(time.time()) // 86400 + 1) * 86400
    assert abs(int(refused.headers["Retry-After"]) - (midnight - time.time())) < 60
    assert "tokens per day budget" in refused.json()["error"]["message"]
    report = json.loads(c.reactq("tenant", "usage", "frugal", "--json").stdout)
    assert report["day"]["tokens"] == usage["day"]["tokens"] and report["plan"] == "standard"


def test_admission_limits(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    """Plan `tiny`: 2 runs in flight, 4 submissions a minute, 1 event stream. No worker: runs stay queued."""
    c = tenancy_cluster
    api = api_server_with(c, api_server, small="tiny", other="standard")
    small, other = api.client(c.env["TEST_KEY_small"]), api.client(c.env["TEST_KEY_other"])

    first = [small.post("/v1/runs", json={"question": f"What is {i} + 1?"}).json()["run_id"] for i in range(2)]
    refused = small.post("/v1/runs", json={"question": "What is 3 + 1?"})
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "5"
    assert "2 runs in flight" in refused.json()["error"]["message"]
    too_big = small.post("/v1/batches", json={"runs": [{"question": "hi"}] * 3})
    assert too_big.status_code == 422 and "smaller parts" in too_big.text

    # one event stream at a time for `small`; `other` still streams
    with small.stream("GET", f"/v1/runs/{first[0]}/events") as open_stream:
        assert open_stream.status_code == 200
        second = small.get(f"/v1/runs/{first[1]}/events")
        assert second.status_code == 429 and "Retry-After" in second.headers
        theirs = other.post("/v1/runs", json={"question": "What is 9 + 9?"}).json()["run_id"]
        with other.stream("GET", f"/v1/runs/{theirs}/events") as other_stream:
            assert other_stream.status_code == 200
    wait_until(lambda: small.post(f"/v1/runs/{first[0]}/cancel").status_code == 200
               and _stream_status(small, first[0]) == 200,
               "small's stream slot to be released once its client went away", 30, interval=0.2)

    for run_id in first:
        small.post(f"/v1/runs/{run_id}/cancel")
    more = [small.post("/v1/runs", json={"question": f"What is {i} + 2?"}) for i in range(2)]
    assert [r.status_code for r in more] == [201, 201]
    for r in more:
        small.post(f"/v1/runs/{r.json()['run_id']}/cancel")
    # small has made 4 submissions, in this minute or across a minute's turn (counting them per minute is
    # test_admission's, on a clock it sets): this minute's and the next one's counters say 4, so the next
    # submission is the fifth of its minute whenever it lands, and the API's answer to it is what is checked.
    minute = int(time.time() // 60)
    client = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    for m in (minute, minute + 1):
        client.set(keys.tenant_submissions(tenant_id(c, "small"), m), 4, ex=180)
    client.close()
    per_minute = small.post("/v1/runs", json={"question": "What is 7 + 7?"})
    assert per_minute.status_code == 429 and 1 <= int(per_minute.headers["Retry-After"]) <= 61
    assert "4 submissions per minute" in per_minute.json()["error"]["message"]


def _stream_status(client: httpx.Client, run_id: str) -> int:
    """Open the run's event stream (a finished run's stream ends by itself) and return its status."""
    with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        response.read()
        return response.status_code


def test_requests_are_checked_before_anything_is_written(tenancy_cluster: Cluster,
                                                         api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    api = api_server_with(c, api_server, checked="standard")
    client = api.client(c.env["TEST_KEY_checked"])
    store = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    before = set(store.keys("reactq:*"))
    bad = client.post("/v1/batches", json={"runs": [{"question": "fine"}, {"question": " "},
                                                    {"question": "fine too"}, {"question": "x", "tier": "gold"}]})
    assert bad.status_code == 422
    message = bad.json()["error"]["message"]
    assert "runs[1]: the question is empty" in message and "runs[3]: unknown tier 'gold'" in message
    assert "runs[0]" not in message
    huge = client.post("/v1/runs", content=b'{"question": "' + b"a" * (2 * 1024 * 1024) + b'"}',
                       headers={"content-type": "application/json"})
    assert huge.status_code == 413 and "request body larger than" in huge.json()["error"]["message"]
    for method, path in [("GET", "/v1/runs/x:steps"), ("GET", "/v1/runs/x:steps/events"),
                         ("POST", "/v1/runs/x:steps/cancel"), ("GET", "/v1/batches/b:runs"),
                         ("GET", "/v1/runs/" + "a" * 65)]:
        response = client.request(method, path)
        assert response.status_code == 400, (path, response.text)
        assert "malformed" in response.json()["error"]["message"]
    assert set(store.keys("reactq:*")) - before <= {b"reactq:tenant:checked"}  # nothing of a run or batch


def test_every_key_of_a_run_or_batch_expires(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    c.env.update(REACTQ_RUN_TTL_S="3600", REACTQ_RETENTION_S="86400")
    api = api_server_with(c, api_server, keeper="standard")
    client = api.client(c.env["TEST_KEY_keeper"])
    store = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    batch = client.post("/v1/batches", json={"runs": [{"question": TWO_STEPS}, {"question": "What is 2 + 2?"}]})
    moving = {k: store.ttl(k) for k in store.keys("reactq:run:*")}
    # unfinished: run_ttl_s, and two refresh periods (run_ttl_s / 8) to spare (worker/store/runs.py)
    assert moving and all(3600 < ttl <= 3600 + 2 * 450 for ttl in moving.values()), moving
    batch_keys = {k: store.ttl(k) for k in store.keys("reactq:batch:*")}
    assert len(batch_keys) == 2 and all(86400 < ttl <= 86400 + 450 for ttl in batch_keys.values()), batch_keys
    c.start_worker(queues="steps", concurrency=8)
    for run_id in batch.json()["run_ids"]:
        assert wait_finished(client, run_id)["status"] == "succeeded"
    finished = {k: store.ttl(k) for k in store.keys("reactq:run:*") + store.keys("reactq:batch:*")}
    assert all(ttl > 0 for ttl in finished.values()), finished
    kept = [store.ttl(f"reactq:run:{run_id}") for run_id in batch.json()["run_ids"]]
    assert all(3600 < ttl <= 86400 for ttl in kept)  # finished runs are kept for retention_s


def test_disallowed_tool_is_not_offered_and_is_refused(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                                       stub_control) -> None:  # noqa: ANN001
    c = tenancy_cluster
    api = api_server_with(c, api_server, free="free")
    c.start_worker(queues="steps,sandbox", concurrency=8)
    client = api.client(c.env["TEST_KEY_free"])
    run = wait_finished(client, client.post("/v1/runs", json={"question": "call python with print(6 * 7)"})
                        .json()["run_id"])
    [refusal] = run["trace"][0]["observations"]
    assert refusal["tool"] == "python" and refusal["outcome"] == "not_allowed"
    assert refusal["content"] == ("Error: tool 'python' is not allowed on this tenant's plan ('free'); "
                                  "available tools: calculator, search.")
    offered = httpx.get(f"{stub_control.root_url}/stub/stats/tools-offered").json()
    assert offered.get("calculator", 0) >= 2 and "python" not in offered


def test_cli_batch_waits_for_admission_and_goes_on(tenancy_cluster: Cluster, tmp_path: Path) -> None:
    c = tenancy_cluster
    assert c.reactq("tenant", "add", "small", "--plan", "tiny").returncode == 0
    c.start_worker(queues="steps", concurrency=8)
    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    infile.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + 1?"}) + "\n" for i in range(3)))
    done = c.reactq("batch", str(infile), "--out", str(out), "--tenant", "small")
    assert done.returncode == 0, done.stderr
    assert "waiting" in done.stderr and "runs in flight" in done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in results) == ["q0", "q1", "q2"]
    assert {r["status"] for r in results} == {"succeeded"}


def test_no_error_names_the_redis_url_or_its_password(tenancy_cluster: Cluster, tmp_path: Path) -> None:
    """A password-protected Redis; every kind of error the API gives, then Redis gone."""
    c = tenancy_cluster
    server = RedisServer(tmp_path, password="s3cret-pw")
    server.start()
    c.env["REACTQ_REDIS_URL"] = server.url
    try:
        key = make_key(c, "guarded", "free")
        api = start_api(c)
        try:
            client, anonymous = api.client(key), api.client(None)
            bodies = [
                anonymous.get("/v1/runs"), api.client("rq_nope").get("/v1/runs"),
                client.get("/v1/runs/" + "0" * 32), client.get("/v1/runs/x:steps"),
                client.post("/v1/runs", json={"question": ""}), client.post("/v1/runs", json={"questoin": "hi"}),
                client.post("/v1/runs", json={"question": "hi", "tier": "pro"}),
                client.post("/v1/runs", json={"question": "hi", "tenant": "someone-else"}),
                client.post("/v1/runs", content=b"x" * (2 * 1024 * 1024)),
            ]
            assert [r.status_code for r in bodies] == [401, 401, 404, 400, 422, 422, 403, 403, 413]
            unknown = c.reactq("ask", "hi", "--tenant", "nobody")
            assert unknown.returncode == 2 and "guarded" not in unknown.stderr  # no list of other tenants
            server.stop()
            down = [anonymous.get("/healthz"), client.get("/v1/runs"), client.get("/v1/usage")]
            assert [r.status_code for r in down] == [503, 503, 503]
            for response in bodies + down:
                text = response.text
                assert response.headers["content-type"].startswith("application/json"), text
                assert "s3cret" not in text and str(server.port) not in text and "redis://" not in text, text
        finally:
            api.stop()
    finally:
        server.stop()


def test_insecure_no_auth_serves_loopback_as_the_first_configured_tenant(tenancy_cluster: Cluster,
                                                                        api_server: Callable[..., Api]) -> None:
    api = api_server("--insecure-no-auth", "--host", "0.0.0.0")
    created = api.client(None).post("/v1/runs", json={"question": "What is 2 + 2?"})
    assert created.status_code == 201 and created.json()["tenant"] == "default"
    log = next(tenancy_cluster.logdir.glob("api-*.log")).read_text()
    assert "--insecure-no-auth" in log and "serving on 127.0.0.1" in log
    port = int(api.url.rsplit(":", 1)[1])
    listening = [line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port]
    assert listening == [f"0100007F:{port:04X}"], listening  # 127.0.0.1 only, despite --host 0.0.0.0


PUBLIC_ROUTES = {"/healthz", "/metrics"}


def test_a_removed_tenants_keys_are_refused_on_every_route(tenancy_cluster: Cluster,
                                                           api_server: Callable[..., Api]) -> None:
    """A tenant of REACTQ_TENANTS with a key, a run and a batch; then the API restarted without it. Every
    route the app serves (read from its OpenAPI document, so a new route is covered too) refuses its key."""
    c = tenancy_cluster
    c.env["REACTQ_TENANTS"] = '["default", "leaver"]'
    key = make_key(c, "leaver")
    before = api_server()
    leaver = before.client(key)
    run_id = leaver.post("/v1/runs", json={"question": "What is 2 + 2?"}).json()["run_id"]
    batch_id = leaver.post("/v1/batches", json={"runs": [{"question": "What is 1 + 1?"}]}).json()["batch_id"]
    assert leaver.get(f"/v1/runs/{run_id}").status_code == 200
    before.stop()

    c.env["REACTQ_TENANTS"] = '["default"]'
    after = api_server().client(key)
    routes = [(method.upper(), path) for path, methods in after.get("/openapi.json").json()["paths"].items()
              if path not in PUBLIC_ROUTES for method in methods if method in {"get", "post", "put", "patch", "delete"}]
    assert len(routes) >= 14, routes
    for method, route in routes:
        path = route.replace("{run_id}", run_id).replace("{batch_id}", batch_id)
        assert "{" not in path, f"{route}: give the test a value for its path parameter"
        response = after.request(method, path)
        assert response.status_code == 403, (method, route, response.text)
        assert response.json()["error"]["message"] == ("this API key's tenant 'leaver' no longer exists; ask "
                                                       "the operator for a key of an existing tenant")
    assert c.load_run(run_id) is not None  # nothing was cancelled or deleted
    assert c.run_status(run_id) == "queued"
