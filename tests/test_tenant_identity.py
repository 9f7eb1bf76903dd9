"""A tenant is an id, not its name: `reactq tenant remove X` then `reactq tenant add X` makes a new tenant
that sees none of the old one's runs, webhook deliveries, eval reports or spend, through the real API, UI
and CLI (real redis-server, `reactq worker` and `reactq api` processes, a real webhook receiver on
loopback). And `reactq webhook secret|set-default|deliveries` serve a tenant made with `reactq tenant add`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import signed_in
from tests.fixtures_cluster import Cluster
from tests.fixtures_receiver import Receiver
from tests.test_ui_pages import stored_eval
from tests.waiting import wait_for
from worker.runtime.webhooks import verify
from worker.store import keys

pytestmark = pytest.mark.integration


def finished(client: httpx.Client, run_id: str) -> dict:
    return wait_for(f"run {run_id} to finish", lambda: client.get(f"/v1/runs/{run_id}").json(), 120,
                    until=lambda run: run.get("finished_at") is not None)


def cli_json(c: Cluster, *args: str) -> list | dict:
    done = c.reactq(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_tenant_added_again_under_a_removed_name_sees_none_of_the_old_ones_data(
        tenancy_cluster: Cluster, api_server: Callable[..., Api], make_receiver: Callable[..., Receiver],
        tmp_path: Path) -> None:
    c = tenancy_cluster
    c.env["REACTQ_WEBHOOK_ALLOW_PRIVATE"] = "1"
    receiver = make_receiver(0)
    old_key = make_key(c, "xco", "standard", via_cli=True)
    c.start_worker()
    api = api_server()
    old = api.client(old_key)
    run_id = old.post("/v1/runs", json={"question": "What is 6 * 7?", "webhook_url": receiver.url}).json()["run_id"]
    assert finished(old, run_id)["tenant"] == "xco"  # the API shows the name, not the id
    receiver.wait_for("the run's webhook", lambda calls: any(x.answered == 200 for x in calls))
    stored_eval(c, tmp_path, 1, tenant="xco")
    delivered = wait_for("the delivery to be recorded as delivered",
                         lambda: old.get("/v1/webhooks/deliveries").json()["deliveries"], 60,
                         until=lambda found: [d["state"] for d in found] == ["delivered"])
    assert delivered[0]["url"] == receiver.url and delivered[0]["tenant"] == "xco"  # the name, not the id
    assert [r["run_id"] for r in old.get("/v1/runs").json()["runs"]][-1] == run_id
    assert old.get("/v1/usage").json()["total"]["prompt_tokens"] > 0
    ui, _ = signed_in(api, old_key)
    assert ui.get(f"/ui/runs/{run_id}").status_code == 200
    assert "subset.jsonl" in ui.get("/ui/evals").text

    removed = c.reactq("tenant", "remove", "xco")
    assert removed.returncode == 0, removed.stderr
    assert old.get("/v1/runs").status_code == 403
    assert ui.get(f"/ui/runs/{run_id}", follow_redirects=False).status_code == 303  # signed out
    new_key = make_key(c, "xco", "standard", via_cli=True)
    new = api.client(new_key)

    assert new.get("/v1/runs").json() == {"runs": [], "next_cursor": None}
    assert new.get(f"/v1/runs/{run_id}").status_code == 404
    assert new.get(f"/v1/runs/{run_id}/events").status_code == 404
    assert new.get("/v1/webhooks/deliveries").json()["deliveries"] == []
    usage = new.get("/v1/usage").json()
    assert usage["total"] == {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
    assert usage["day"]["tokens"] == 0 and usage["month"]["usd"] == 0
    new_ui, _ = signed_in(api, new_key)
    assert new_ui.get(f"/ui/runs/{run_id}").status_code == 404
    evals = new_ui.get("/ui/evals")
    assert evals.status_code == 200 and "subset.jsonl" not in evals.text
    runs_page = new_ui.get("/ui/runs").text
    assert run_id not in runs_page and "tenant xco</span>" in runs_page  # the UI shows the name

    # the old tenant's data is kept until retention expires it: its keys have a TTL now
    client = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    try:
        [old_id] = [k.decode().split(":")[2] for k in client.keys(keys.tenant("xco.*") + ":runs")
                    if client.zscore(k, run_id) is not None]
        left = client.keys(keys.tenant(old_id) + ":*")
        assert left and all(client.ttl(k) > 0 for k in left), [(k, client.ttl(k)) for k in left]
    finally:
        client.close()


def test_the_webhook_commands_serve_an_added_tenant_and_its_secret_verifies_a_real_delivery(
        tenancy_cluster: Cluster, api_server: Callable[..., Api], make_receiver: Callable[..., Receiver]) -> None:
    c = tenancy_cluster
    c.env["REACTQ_WEBHOOK_ALLOW_PRIVATE"] = "1"
    receiver = make_receiver(0)
    key = make_key(c, "hooked", "standard", via_cli=True)
    set_default = c.reactq("webhook", "set-default", "hooked", receiver.url)
    assert set_default.returncode == 0, set_default.stderr
    secret = c.reactq("webhook", "secret", "hooked").stdout.strip()
    assert len(secret) == 64, secret
    c.start_worker()
    api = api_server()
    run_id = api.client(key).post("/v1/runs", json={"question": "What is 6 * 7?"}).json()["run_id"]
    [call] = receiver.wait_for("the run's webhook", lambda calls: any(x.answered == 200 for x in calls))
    assert json.loads(call.body)["run_id"] == run_id and json.loads(call.body)["tenant"] == "hooked"
    verify(secret, call.body, call.headers["x-reactq-timestamp"], call.headers["x-reactq-signature"])
    listed = wait_for("the delivery to be recorded as delivered",
                      lambda: cli_json(c, "webhook", "deliveries", "--tenant", "hooked", "--json"), 60,
                      until=lambda found: [d["state"] for d in found] == ["delivered"])
    assert listed[0]["subject_id"] == run_id and listed[0]["url"] == receiver.url and listed[0]["tenant"] == "hooked"
    rotated = c.reactq("webhook", "secret", "hooked", "--rotate").stdout.strip()
    assert len(rotated) == 64 and rotated != secret
    cleared = c.reactq("webhook", "set-default", "hooked", "--clear")
    assert cleared.returncode == 0, cleared.stderr
    unknown = c.reactq("webhook", "secret", "nobody")
    assert unknown.returncode == 2 and "unknown tenant 'nobody'" in unknown.stderr


def test_remove_with_purge_deletes_the_tenants_data_at_once(
        tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    key = make_key(c, "gone", "standard", via_cli=True)
    c.start_worker()
    api = api_server()
    client_api = api.client(key)
    run_id = client_api.post("/v1/runs", json={"question": "What is 6 * 7?"}).json()["run_id"]
    finished(client_api, run_id)
    [listed] = [t for t in cli_json(c, "tenant", "list", "--json") if t["tenant"] == "gone"]
    tenant_id = listed["id"]
    assert tenant_id.startswith("gone.") and tenant_id != "gone"
    client = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    try:
        assert client.exists(keys.run(run_id)) and client.keys(keys.tenant(tenant_id) + ":*")
        removed = c.reactq("tenant", "remove", "gone", "--purge")
        assert removed.returncode == 0, removed.stderr
        assert "deleted" in removed.stdout
        assert client.keys(f"{keys.run(run_id)}*") == []
        assert client.keys(keys.tenant(tenant_id) + "*") == []
        assert client.hget(keys.TENANT_IDS, "gone") is None
    finally:
        client.close()
    assert client_api.get("/v1/runs").status_code == 403
