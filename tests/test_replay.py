"""Replay and fork: where two traces diverge (pure), and `reactq replay` / `POST /v1/runs/{id}/replay`
against real redis-server and `reactq worker` processes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest
import redis

from tests.fixtures_api import Api, make_key
from tests.fixtures_cluster import Cluster
from worker.core.models import Observation, Run, RunSpec, RunStatus, Step, ToolCall
from worker.core.trace_diff import diff_traces
from worker.store import keys
from worker.store.tenant_records import TenantStore
from worker.tenancy.tenants import Tenants

QUESTION = "What is 6 * 7 and what is the capital of Japan and who painted the Mona Lisa?"


def calc_step(index: int, expression: str, value: str, call_id: str = "c1", thought: str = "t") -> Step:
    return Step(index=index, thought=thought, tool_calls=[ToolCall(id=call_id, name="calculator",
                                                                  arguments={"expression": expression})],
                observations=[Observation(call_id=call_id, tool="calculator", content=value)])


def run(answer: str | None) -> Run:
    return Run(spec=RunSpec(question="q"), status=RunStatus.SUCCEEDED, answer=answer)


def test_same_decisions_worded_differently_do_not_diverge() -> None:
    a = [calc_step(0, "6 * 7", "42", "c1", "let me compute"), Step(index=1, final_answer="42")]
    b = [calc_step(0, "6 * 7", "42", "zz", "I will use the calculator"), Step(index=1, final_answer="42")]
    diff = diff_traces(run("42"), a, run("42"), b)
    assert diff.diverges_at is None and all(p.same for p in diff.steps)


@pytest.mark.parametrize(("b", "at"), [
    ([calc_step(0, "6 * 7", "42"), Step(index=1, final_answer="forty-two")], 2),
    ([calc_step(0, "6*7", "42"), Step(index=1, final_answer="42")], 1),
    ([calc_step(0, "6 * 7", "41"), Step(index=1, final_answer="42")], 1),
    ([calc_step(0, "6 * 7", "42")], 2),
    ([calc_step(0, "6 * 7", "42"), Step(index=1, error="bad format"), Step(index=2, final_answer="42")], 2),
])
def test_divergence_is_the_first_step_that_differs(b: list[Step], at: int) -> None:
    a = [calc_step(0, "6 * 7", "42"), Step(index=1, final_answer="42")]
    diff = diff_traces(run("42"), a, run(None), b)
    assert diff.diverges_at == at
    assert len(diff.steps) == max(len(a), len(b)) and diff.steps[0].a.startswith("calculator(")
    json.dumps(diff.to_json())


@pytest.mark.integration
def test_replay_reuses_steps_and_forks_with_another_mode(cluster: Cluster, api_client: httpx.Client) -> None:
    cluster.start_worker(queues="steps,sandbox")
    source = json.loads(cluster.reactq("ask", QUESTION, "--wait", "--json").stdout)
    assert source["status"] == "succeeded" and source["steps"] == 2 and source["mode"] == "tools"

    same = cluster.reactq("replay", source["run_id"], "--from-step", "2")
    assert same.returncode == 0, same.stderr
    fork = cluster.wait_for_run(same.stdout.strip())
    assert fork["status"] == "succeeded" and fork["answer"] == source["answer"]
    assert fork["forked_from"] == source["run_id"] and fork["steps"] == 2
    source_trace = json.loads(cluster.reactq("trace", source["run_id"], "--json").stdout)["trace"]
    fork_trace = json.loads(cluster.reactq("trace", fork["run_id"], "--json").stdout)["trace"]
    assert fork_trace[0] == source_trace[0]  # step 1 reused as recorded, not asked again
    assert fork["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in fork_trace)
    diff = json.loads(cluster.reactq("trace", "--diff", source["run_id"], fork["run_id"], "--json").stdout)
    assert diff["diverges_at"] is None

    created = api_client.post(f"/v1/runs/{source['run_id']}/replay", json={"from_step": 1, "mode": "text"})
    assert created.status_code == 201, created.text
    text_fork = cluster.wait_for_run(created.json()["run_id"])
    assert text_fork["status"] == "succeeded" and text_fork["mode"] == "text" and text_fork["steps"] == 4
    shown = cluster.reactq("trace", "--diff", source["run_id"], text_fork["run_id"], COLUMNS="300").stdout
    assert "diverge at step 1" in shown

    bad = cluster.reactq("replay", source["run_id"], "--from-step", "4")
    assert bad.returncode == 2 and "between 1 and 3" in bad.stderr
    past = api_client.post(f"/v1/runs/{source['run_id']}/replay", json={"from_step": 4})
    assert past.status_code == 409 and "between 1 and 3" in past.json()["error"]["message"]  # the run's state
    assert api_client.post("/v1/runs/nope/replay", json={"from_step": 1}).status_code == 404
    assert api_client.post(f"/v1/runs/{source['run_id']}/replay", json={"from_step": 0}).status_code == 422


@pytest.mark.integration
def test_replay_is_admitted_as_a_submission_is(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    """No worker: every run stays queued, so each replay holds a run in flight. A replay (from step 1: no
    recorded step is needed) meets the free plan's 10 runs in flight, a spent budget and a downgraded plan
    as a new run would."""
    c = tenancy_cluster
    thrifty, spent, former_pro = (make_key(c, "thrifty", "free"), make_key(c, "spent", "free"),
                                  make_key(c, "former-pro", "pro"))
    api = api_server()
    client = api.client(thrifty)
    source = client.post("/v1/runs", json={"question": "What is 2 + 2?"}).json()["run_id"]
    forks = [client.post(f"/v1/runs/{source}/replay", json={"from_step": 1}) for _ in range(9)]
    assert [f.status_code for f in forks] == [201] * 9, forks[-1].text
    assert {f.json()["forked_from"] for f in forks} == {source}
    store = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    before = set(store.scan_iter("reactq:run:*"))
    refused = client.post(f"/v1/runs/{source}/replay", json={"from_step": 1})
    assert set(store.scan_iter("reactq:run:*")) == before  # a refused replay writes nothing
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "5", refused.text
    assert "10 runs in flight" in refused.json()["error"]["message"]
    assert client.get("/v1/usage").json()["runs_in_flight"] == 10
    cli = c.reactq("replay", source, "--from-step", "1")
    assert cli.returncode == 2 and "10 runs in flight" in cli.stderr

    spender = api.client(spent)
    theirs = spender.post("/v1/runs", json={"question": "What is 3 + 3?"}).json()["run_id"]
    spent_id = Tenants(TenantStore(store), c.settings()).resolve("spent")  # its spend is stored under its id
    store.hset(keys.tenant_spend(spent_id, time.strftime("d:%Y-%m-%d", time.gmtime())), "tokens", 200_000)
    store.close()
    over = spender.post(f"/v1/runs/{theirs}/replay", json={"from_step": 1})
    assert over.status_code == 429 and int(over.headers["Retry-After"]) > 0, over.text
    assert "tokens per day budget" in over.json()["error"]["message"]

    pro = api.client(former_pro)
    old = pro.post("/v1/runs", json={"question": "What is 4 + 4?"}).json()
    assert old["tier"] == "pro"
    assert c.reactq("tenant", "set", "former-pro", "--plan", "free").returncode == 0
    downgraded = pro.post(f"/v1/runs/{old['run_id']}/replay", json={"from_step": 1})
    assert downgraded.status_code == 403, downgraded.text
    message = downgraded.json()["error"]["message"]
    assert "tier 'pro' is not allowed on plan 'free'; allowed tiers: free" in message and "tier" in message
    assert pro.post(f"/v1/runs/{old['run_id']}/replay", json={"from_step": 1, "tier": "standard"}).status_code == 403
    cli = c.reactq("replay", old["run_id"], "--from-step", "1")
    assert cli.returncode == 2 and "not allowed on plan 'free'" in cli.stderr
    fork = pro.post(f"/v1/runs/{old['run_id']}/replay", json={"from_step": 1, "tier": "free"})
    assert fork.status_code == 201 and fork.json()["tier"] == "free", fork.text
