"""The UI's runs pages at the HTTP level, against real redis-server, real `reactq worker` processes, the
real `reactq api` and the api_stub: what a run page shows, tenant isolation (another tenant's run is the
404 page, wherever it is asked for), the operator's view of every tenant, escaping of a hostile answer,
the forms (approve, reject, cancel, replay) and their CSRF token, filters and the cursor."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import markupsafe
import pytest

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import (
    CALCULATOR_NEEDS_APPROVAL,
    HOSTILE,
    HOSTILE_QUESTION,
    hostile_corpus,
    operator_key,
    signed_in,
    submit,
    waiting_cluster,
    waiting_run,
)
from tests.fixtures_cluster import Cluster

pytestmark = pytest.mark.integration


def run_ids(page: str) -> list[str]:
    return re.findall(r'href="/ui/runs/([0-9a-f]{32})"', page)


def test_a_run_page_shows_the_run_and_its_steps(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    run_id = submit(api, key, "What is 17 * 23?")
    done = tenancy_cluster.wait_for_run(run_id)
    assert done["status"] == "succeeded", done
    client, _ = signed_in(api, key)
    page = client.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200
    text = page.text
    assert "What is 17 * 23?" in text and '<pre id="answer">391</pre>' in text
    assert 'id="step-1"' in text and "<code>calculator</code>" in text and "17 * 23" in text
    assert f"{done['usage']['prompt_tokens']} prompt + {done['usage']['completion_tokens']} completion" in text
    assert "Replay from this step" in text and "data-events" not in text  # finished: nothing to follow
    assert run_ids(client.get("/ui/runs").text) == [run_id]
    fragment = client.get(f"/ui/runs/{run_id}/live")
    assert fragment.status_code == 200 and fragment.text.lstrip().startswith('<section id="live"')


def test_another_tenants_run_is_a_404_page_everywhere(tenancy_cluster: Cluster,
                                                     api_server: Callable[..., Api]) -> None:
    mine, theirs = make_key(tenancy_cluster, "acme", plan="free"), make_key(tenancy_cluster, "rival", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    their_run = submit(api, theirs, "What is 2 + 2?")
    tenancy_cluster.wait_for_run(their_run)
    client, token = signed_in(api, mine)
    unknown = "0" * 32
    for run_id in (their_run, unknown):
        for path in (f"/ui/runs/{run_id}", f"/ui/runs/{run_id}/live", f"/ui/runs/{run_id}/events"):
            answer = client.get(path)
            assert answer.status_code == 404 and "Not found" in answer.text, path
            assert "2 + 2" not in answer.text
        for action, data in (("approvals", {"decision": "approve"}), ("cancel", {}), ("replay", {"from_step": "1"})):
            answer = client.post(f"/ui/runs/{run_id}/{action}", data={**data, "csrf_token": token})
            assert answer.status_code == 404, action
    assert their_run not in client.get("/ui/runs").text
    same = client.get(f"/ui/runs/{unknown}").text.replace(unknown, their_run)
    assert client.get(f"/ui/runs/{their_run}").text == same  # exactly the page of an unknown run


def test_the_operator_sees_every_tenant_and_filters_by_one(tenancy_cluster: Cluster,
                                                          api_server: Callable[..., Api]) -> None:
    acme, rival = make_key(tenancy_cluster, "acme", plan="free"), make_key(tenancy_cluster, "rival", plan="free")
    operator = operator_key(tenancy_cluster)
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    a, r = submit(api, acme, "What is 3 + 4?"), submit(api, rival, "What is 5 + 6?")
    for run_id in (a, r):
        tenancy_cluster.wait_for_run(run_id)
    client, token = signed_in(api, operator)
    assert set(run_ids(client.get("/ui/runs").text)) == {a, r}
    assert run_ids(client.get("/ui/runs", params={"tenant": "rival"}).text) == [r]
    page = client.get(f"/ui/runs/{a}")
    assert page.status_code == 200 and "What is 3 + 4?" in page.text and "Replay from this step" not in page.text
    refused = client.post(f"/ui/runs/{a}/replay", data={"from_step": "1", "csrf_token": token})
    assert refused.status_code == 403  # an operator key looks; a tenant's key acts
    # a tenant's filter field is ignored: the key decides
    tenant_client, _ = signed_in(api, acme)
    assert run_ids(tenant_client.get("/ui/runs", params={"tenant": "rival"}).text) == [a]


def test_a_hostile_answer_is_text(tenancy_cluster: Cluster, api_server: Callable[..., Api], tmp_path: Path) -> None:
    hostile_corpus(tenancy_cluster, tmp_path)
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    run_id = submit(api, key, HOSTILE_QUESTION)
    done = tenancy_cluster.wait_for_run(run_id)
    assert HOSTILE in done["answer"], done  # the model's answer is the markup
    client, _ = signed_in(api, key)
    for page in (client.get(f"/ui/runs/{run_id}").text, client.get("/ui/runs").text):
        assert "<script>window" not in page and "<img src=x" not in page
    page = client.get(f"/ui/runs/{run_id}").text
    assert str(markupsafe.escape(HOSTILE)) in page


def test_approve_and_reject_from_the_forms(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    tenancy_cluster.env.update(CALCULATOR_NEEDS_APPROVAL)
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    approved, rejected = submit(api, key, "What is 6 * 7?"), submit(api, key, "What is 8 * 9?")
    client, token = signed_in(api, key)
    for run_id in (approved, rejected):
        tenancy_cluster.wait_for_status(run_id, lambda s: s == "awaiting_approval", "awaiting approval", 120)
        page = client.get(f"/ui/runs/{run_id}").text
        assert "Waiting for approval" in page and 'value="approve"' in page and "Reason for rejecting" in page
        call_id = re.search(r'name="call_id" value="([^"]+)"', page)[1]  # type: ignore[index]
        # no token, a wrong token: refused, and nothing was decided
        for data in ({"decision": "approve", "call_id": call_id},
                     {"decision": "approve", "call_id": call_id, "csrf_token": "x" * 43}):
            assert client.post(f"/ui/runs/{run_id}/approvals", data=data).status_code == 403
        assert tenancy_cluster.run_status(run_id) == "awaiting_approval"
    answer = client.post(f"/ui/runs/{approved}/approvals",
                         data={"decision": "approve", "call_id": "", "csrf_token": token})
    assert answer.status_code == 303 and answer.headers["location"] == f"/ui/runs/{approved}"
    answer = client.post(f"/ui/runs/{rejected}/approvals",
                         data={"decision": "reject", "reason": "no <b>maths</b> today", "csrf_token": token})
    assert answer.status_code == 303
    assert tenancy_cluster.wait_for_run(approved)["answer"] == "42"
    done = tenancy_cluster.wait_for_run(rejected)
    [decision] = done["approvals"]
    assert decision["decision"] == "rejected" and decision["reason"] == "no <b>maths</b> today"
    assert decision["decided_by"] == "ui:acme"
    page = client.get(f"/ui/runs/{rejected}").text
    assert "no &lt;b&gt;maths&lt;/b&gt; today" in page and "Waiting for approval" not in page
    again = client.post(f"/ui/runs/{approved}/approvals", data={"decision": "approve", "csrf_token": token})
    assert again.status_code == 409 and "Conflict" in again.text  # nothing left to decide: a page, not JSON


def test_cancel_and_replay_from_the_forms(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    api, key, waiting = waiting_cluster(tenancy_cluster, api_server)
    client, token = signed_in(api, key)
    assert client.post(f"/ui/runs/{waiting}/cancel", data={}).status_code == 403
    assert client.post(f"/ui/runs/{waiting}/cancel", data={"csrf_token": token}).status_code == 303
    assert tenancy_cluster.wait_for_run(waiting)["status"] == "cancelled"
    page = client.get(f"/ui/runs/{waiting}").text
    assert "Cancel run" not in page and "cancelled" in page
    # replay the cancelled run from its first step: a new run of the same question
    answer = client.post(f"/ui/runs/{waiting}/replay", data={"from_step": "1", "csrf_token": token})
    assert answer.status_code == 303, answer.text
    fork = answer.headers["location"].rsplit("/", 1)[1]
    assert fork != waiting
    forked = json.loads(api.client(key).get(f"/v1/runs/{fork}").text)
    assert forked["forked_from"] == waiting and forked["question"] == "What is 6 * 7?"
    bad = client.post(f"/ui/runs/{waiting}/replay", data={"from_step": "99", "csrf_token": token})
    assert bad.status_code == 422 and "<html" in bad.text


def test_filters_and_the_cursor(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    tenancy_cluster.env.update(CALCULATOR_NEEDS_APPROVAL)
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    first = submit(api, key, "What is the capital of France?")
    tenancy_cluster.wait_for_run(first)
    waiting = waiting_run(tenancy_cluster, api, key)
    last = submit(api, key, "What is the capital of Italy?")
    tenancy_cluster.wait_for_run(last)
    client, _ = signed_in(api, key)
    assert run_ids(client.get("/ui/runs").text) == [last, waiting, first]  # newest first
    assert run_ids(client.get("/ui/runs", params={"status": "awaiting_approval"}).text) == [waiting]
    assert run_ids(client.get("/ui/runs", params={"model": "reactq-stub"}).text) == [last, waiting, first]
    assert run_ids(client.get("/ui/runs", params={"until": "2000-01-01T00:00"}).text) == []
    assert len(run_ids(client.get("/ui/runs", params={"since": "2000-01-01T00:00"}).text)) == 3
    assert client.get("/ui/runs", params={"status": "nonsense"}).status_code == 400
    # one run a page: the cursor walks the list
    seen, params = [], {"limit": "1"}
    for _ in range(4):
        page = client.get("/ui/runs", params=params).text
        seen += run_ids(page)
        older = re.search(r'rel="next" href="/ui/runs\?([^"]+)"', page)
        if older is None:
            break
        params = dict(httpx.QueryParams(html.unescape(older[1])))
    assert seen == [last, waiting, first]
    counts = client.get("/ui/runs/counts").text
    assert re.search(r"succeeded</span> <strong>2</strong>", counts)
    assert re.search(r"awaiting_approval</span> <strong>1</strong>", counts)


def test_the_ui_event_stream_follows_the_session(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    api, key, waiting = waiting_cluster(tenancy_cluster, api_server)
    client, token = signed_in(api, key)
    assert httpx.get(f"{api.url}/ui/runs/{waiting}/events").status_code == 303  # no session: no stream
    with client.stream("GET", f"/ui/runs/{waiting}/events") as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert "event: queued" in [next(lines) for _ in range(3)]
        # the key is revoked while the stream is open: the stream ends with an error event
        assert tenancy_cluster.reactq("key", "revoke", key.split("_")[1]).returncode == 0
        rest = list(lines)
    assert "event: error" in rest and any("revoked" in line for line in rest)


def test_a_run_ended_at_a_limit_shows_its_partial_answer(tenancy_cluster: Cluster,
                                                        api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    created = api.client(key).post("/v1/runs", json={"question": "What is 17 * 23?", "max_steps": 1})
    run_id = created.json()["run_id"]
    done = tenancy_cluster.wait_for_run(run_id)
    assert done["status"] == "max_steps" and done["partial"] is True, done
    client, _ = signed_in(api, key)
    page = client.get(f"/ui/runs/{run_id}").text
    assert 'id="partial"' in page and "partial: ended at a limit (max_steps)" in page
    assert "safeguard: max_steps" in page or "best effort" in page
    assert '<span class="tag">partial</span>' in client.get("/ui/runs").text


def test_a_sandboxed_call_shows_the_sandboxs_flags(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="standard")  # a plan with the python tool
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4, REACTQ_SANDBOX_BACKEND="process")
    run_id = submit(api, key, "Run this python code:\n```python\nprint('x' * 10**7)\n```")
    tenancy_cluster.wait_for_run(run_id)
    [observation] = api.client(key).get(f"/v1/runs/{run_id}?trace=true").json()["trace"][0]["observations"]
    facts = observation["sandbox"]  # kept with the step: the sandbox's own result is gone when the run ends
    assert facts["flags"] == ["truncated"] and facts["error_kind"] == "output_limit", facts
    client, _ = signed_in(api, key)
    page = client.get(f"/ui/runs/{run_id}").text
    sandbox = re.search(r'<p class="sandbox">(.*?)</p>', page, re.S)
    assert sandbox is not None, "no sandbox line on the page"
    assert '<span class="tag bad">truncated</span>' in sandbox[1] and "error_kind: output_limit" in sandbox[1]
    assert f"exit {facts['exit_code']}, tier standard, process" in sandbox[1]
