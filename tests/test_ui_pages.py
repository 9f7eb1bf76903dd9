"""The UI's trace diff, batches, evaluation reports and operations pages over HTTP: a real `reactq api`,
real workers, Redis and the api_stub (tests/fixtures_api.py); and the operations page's figures (pure)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry, Counter, Gauge

from api_stub import FaultConfig, StubServer
from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import operator_key, signed_in
from tests.fixtures_cluster import ROOT, Cluster
from tests.waiting import wait_for
from worker.api.ui.routes_pages import REPORT_LINKS
from worker.core.ops_view import LimiterCells, OpsRaw, ops_view
from worker.evals import report as eval_report
from worker.evals.report import render as render_report
from worker.evals.summary import summarise
from worker.runtime.ops_snapshot import read_families
from worker.store.eval_reports import from_settings


def _snapshot(member: str, at: float, counters: dict[str, float], prev: dict[str, float],
              gauges: dict[str, float] | None = None, queues: list[str] | None = None) -> dict:
    return {"member": member, "queues": queues or ["reactq.steps"], "at": at, "prev_at": at - 10,
            "counters": counters, "prev": prev, "gauges": gauges or {}}


def test_ops_view_sums_rates_and_totals_over_the_live_processes() -> None:
    a = _snapshot("h:1", 1000.0, {
        "reactq_steps_total|outcome=tool_calls": 120, "reactq_steps_total|outcome=final_answer": 30,
        "reactq_llm_tokens_total|model=m,type=prompt": 5000, "reactq_llm_tokens_total|model=m,type=completion": 1000,
        "reactq_tool_failures_total|tool=search,error_type=timeout": 4,
        "reactq_llm_throttled_total|model=m,reason=provider_429": 6,
        "reactq_llm_throttled_total|model=m,reason=pacing": 9,
        "reactq_reaper_actions_total|action=lost_message": 2,
    }, {"reactq_steps_total|outcome=tool_calls": 100, "reactq_steps_total|outcome=final_answer": 30,
        "reactq_llm_tokens_total|model=m,type=prompt": 4000, "reactq_llm_tokens_total|model=m,type=completion": 1000,
        "reactq_llm_throttled_total|model=m,reason=provider_429": 3})
    b = _snapshot("h:2", 1001.0, {
        "reactq_steps_total|outcome=tool_calls": 10, "reactq_tool_failures_total|tool=search,error_type=timeout": 1,
        "reactq_tool_failures_total|tool=python,error_type=oom": 2,
        "reactq_sandbox_executions_total|tier=free,outcome=ok": 50,
        "reactq_sandbox_executions_total|tier=free,outcome=timeout": 10,
    }, {"reactq_sandbox_executions_total|tier=free,outcome=ok": 30}, gauges={
        "reactq_sandbox_warm_containers|tier=free,state=unbound": 2,
        "reactq_sandbox_warm_containers|tier=free,state=bound": 1,
        "reactq_sandbox_calls_waiting|tier=free": 3, "reactq_sandbox_backend_up|backend=docker": 1,
    }, queues=["reactq.sandbox"])
    raw = OpsRaw(now=1005.0, redis_now_us=1_000_000.0, queues={"reactq.steps": [1, 0, 7] + [0] * 7},
                 unacked=2, workers={"reactq.steps": 1}, active_runs=9,
                 limiters=[LimiterCells("m", 1_250_000.0, None, 400), LimiterCells("quiet", None, None, 0),
                           LimiterCells("down", None, None, 0, circuit_open_ms=3000)], snapshots=[a, b],
                 reaped=[{"at": 990.0, "run_id": "r1", "step": 2, "action": "dead_worker"}])
    view = ops_view(raw, {"m": (60, None)})
    assert view.queues[0].total == 8 and view.queues[0].by_priority[2] == 7 and view.queues[0].workers == 1
    assert view.steps_per_s == (20 + 10) / 10  # a: 20 in its 10 s; b: 10 since it started (prev 0)
    assert view.tokens_per_s == 100.0 and view.tokens_by_model[0].labels == ("m",)
    assert [(f.labels, f.total) for f in view.tool_failures] == [(("search", "timeout"), 5), (("python", "oom"), 2)]
    down, limiter = view.limiters  # "quiet": no limit, never held back, circuit closed: no row
    assert (down.model, down.circuit_open_ms, down.rpm) == ("down", 3000, None) and limiter.circuit_open_ms == 0
    assert limiter.rpm == 60 and limiter.rpm_booked_ms == 250 and limiter.cooldown_ms == 400
    assert limiter.provider_429 == 6 and limiter.provider_429_per_min == 60 * 3 / 10
    assert limiter.held_back == {"pacing": 9}
    [tier] = view.sandbox
    assert (tier.tier, tier.warm_unbound, tier.warm_bound, tier.waiting) == ("free", 2, 1, 3)
    assert tier.executions == 60 and tier.executions_per_s == 3.0 and tier.failures_per_s == 1.0
    assert (view.backends_up, view.backends) == (1, 1)
    assert [(f.labels, f.total) for f in view.reaper] == [(("lost_message",), 2)]
    assert [(r.run_id, r.step, r.action) for r in view.reaped] == [("r1", 2, "dead_worker")]
    assert [p.member for p in view.processes] == ["h:1", "h:2"] and view.processes[0].age_s == 5


def test_no_inline_script_or_style_in_the_pages_templates() -> None:
    """The pages' templates keep to the UI's CSP as base.html's do (tests/test_ui_auth.py checks templates/*.html)."""
    templates = sorted((ROOT / "worker" / "api" / "ui" / "templates" / "pages").glob("*.html"))
    assert len(templates) == 7
    for path in templates:
        text = path.read_text()
        assert not re.search(r"<script", text) and "<style" not in text and " style=" not in text, path.name
        assert not re.search(r"\son[a-z]+=", text) and "|safe" not in text.replace(" ", ""), path.name
        assert "autoescape false" not in text, path.name
        assert path.name.startswith("_") or text.startswith('{% extends "base.html" %}'), path.name


def test_a_process_snapshot_keeps_the_wanted_labels_and_sums_the_rest() -> None:
    registry = CollectorRegistry()
    tokens = Counter("reactq_llm_tokens_total", "t", ["model", "type", "tenant"], registry=registry)
    tokens.labels("m", "prompt", "acme").inc(5)
    tokens.labels("m", "prompt", "other").inc(7)
    Counter("reactq_unrelated_total", "u", registry=registry).inc()
    Counter("reactq_steps_total", "s", ["outcome"], registry=registry).labels("tool_calls")  # zero: left out
    Gauge("reactq_sandbox_calls_waiting", "w", ["tier"], registry=registry).labels("free").set(4)
    counters, gauges = read_families(registry)
    assert counters == {"reactq_llm_tokens_total|model=m,type=prompt": 12}
    assert gauges == {"reactq_sandbox_calls_waiting|tier=free": 4}


# --- over HTTP: a real `reactq api`, workers, Redis and the api_stub ------------------------------
QUESTION = "What is 6 * 7 and what is the capital of Japan and who painted the Mona Lisa?"


def text_of(html: str) -> str:
    """The page's text with tags and runs of whitespace collapsed (for reading figures)."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


BATCH: list[dict[str, Any]] = [  # q3 stops at its limit: a failed run
    {"id": "q1", "question": "What is 6 * 7?"}, {"id": "q2", "question": "What is the capital of Japan?"},
    {"id": "q3", "question": QUESTION, "max_steps": 1}]


def run_batch(c: Cluster, tmp_path: Path, lines: list[dict]) -> tuple[Path, list[dict], str]:
    """`reactq batch --out` over `lines` for tenant acme: the output file, its lines, and the batch id."""
    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    infile.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = c.reactq("batch", str(infile), "--out", str(out), "--tenant", "acme")
    assert done.returncode == 0, done.stderr
    results = [json.loads(t) for t in out.read_text().splitlines()]
    run = c.load_run(results[0]["run_id"])
    assert run is not None and run.spec.batch_id
    return out, results, run.spec.batch_id


@pytest.mark.integration
def test_batch_pages_trace_diff_and_tenant_isolation(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                                     tmp_path: Path) -> None:
    c = tenancy_cluster
    acme, other = make_key(c, "acme", "pro"), make_key(c, "other", "free")
    c.start_worker()
    out, results, batch_id = run_batch(c, tmp_path, BATCH)
    written = out.read_text()
    by_id = {line["id"]: line for line in results}
    assert by_id["q3"]["status"] != "succeeded" and by_id["q1"]["status"] == "succeeded"
    api = api_server()
    ui, _ = signed_in(api, acme)

    listing = ui.get("/ui/batches")
    assert listing.status_code == 200 and f'data-batch="{batch_id}"' in listing.text
    assert "3 / 3" in text_of(listing.text)
    page = ui.get(f"/ui/batches/{batch_id}")
    assert page.status_code == 200
    text = text_of(page.text)
    assert "3 of 3 runs finished (100%)" in text and 'value="3"' in page.text
    statuses = dict(re.findall(r'<li data-status="([a-z_]+)">.*?</span> (\d+)</li>', page.text))
    assert statuses == {"succeeded": "2", by_id["q3"]["status"]: "1"}
    tokens = sum(v["usage"]["prompt_tokens"] + v["usage"]["completion_tokens"] for v in by_id.values())
    assert f"{tokens} (" in text and tokens > 0
    failed = page.text[page.text.index('id="failed"'):]
    assert by_id["q3"]["run_id"] in failed and by_id["q1"]["run_id"] not in failed
    slowest = page.text[page.text.index('id="slowest"'):page.text.index('id="failed-title"')]
    assert all(line["run_id"] in slowest for line in by_id.values())
    download = ui.get(f"/ui/batches/{batch_id}/results.jsonl")
    assert download.status_code == 200 and download.headers["content-type"] == "application/x-ndjson"
    assert "attachment" in download.headers["content-disposition"]
    assert download.text == written  # the very lines `reactq batch --out` wrote, in the same order

    # trace diff: a fork of a two-step run, replayed from step 2 in text mode, diverges at step 2
    tenant_api = api.client(acme)
    source = tenant_api.post("/v1/runs", json={"question": QUESTION}).json()["run_id"]
    assert c.wait_for_run(source)["steps"] == 2
    fork = tenant_api.post(f"/v1/runs/{source}/replay", json={"from_step": 2, "mode": "text"}).json()["run_id"]
    c.wait_for_run(fork)
    diff = ui.get("/ui/diff", params={"a": source, "b": fork})
    assert diff.status_code == 200
    assert re.search(r'The runs diverge at step <span id="diverges-at">2</span>', diff.text)
    marked = re.search(r'<tr data-step="(\d+)" data-same="no" id="first-divergence"', diff.text)
    assert marked and marked[1] == "2" and '<tr data-step="1" data-same="yes">' in diff.text
    assert "first divergence" in text_of(diff.text) and "calculator(" in diff.text
    assert ui.get("/ui/trace-diff", params={"a": source, "b": source}).text.count("The traces are the same") == 1

    # another tenant: every one of these is the 404 page, as for an unknown id
    theirs, _ = signed_in(api, other)
    for path in (f"/ui/batches/{batch_id}", f"/ui/batches/{batch_id}/results.jsonl",
                 f"/ui/diff?a={source}&b={fork}", f"/ui/batches/{'0' * 32}"):
        refused = theirs.get(path)
        # nothing of the runs (not their answer "42": the page names the id asked for, hex that may hold "42")
        assert refused.status_code == 404 and "<h1" in refused.text and "What is 6 * 7?" not in refused.text
    assert batch_id not in theirs.get("/ui/batches").text
    for before in ("nan", "inf", "x"):
        assert theirs.get("/ui/batches", params={"before": before}).status_code == 400
    assert ui.get("/ui/ops").status_code == 403  # a tenant's key: not the operations page
    everyone, _ = signed_in(api, operator_key(c))
    assert f'data-batch="{batch_id}"' in everyone.get("/ui/batches").text
    assert f'data-batch="{batch_id}"' not in everyone.get("/ui/batches", params={"tenant": "other"}).text
    assert everyone.get(f"/ui/batches/{batch_id}/results.jsonl").text == written


def stored_eval(cluster: Cluster, tmp_path: Path, questions: int, tenant: str = "acme") -> None:
    """`reactq eval --report` of the bundled set's first `questions` (file subset.jsonl), stored for `tenant`."""
    subset = tmp_path / "subset.jsonl"
    lines = (ROOT / "worker" / "data" / "eval_set.jsonl").read_text().splitlines()[:questions]
    subset.write_text("\n".join(lines) + "\n")
    done = cluster.reactq("eval", str(subset), "--out", str(tmp_path / "r.jsonl"), "--report",
                          str(tmp_path / "r.html"), "--tenant", tenant)
    assert done.returncode == 0, done.stderr


def hostile_report(cluster: Cluster, tenant: str, name: str) -> tuple[str, str]:
    """Store a report made by the real report writer from lines whose texts are hostile; (id, its HTML)."""
    lines = [{"id": "x1", "question": "<script>alert(1)</script>?", "expected": "42", "status": "succeeded",
              "answer": "<img src=x onerror=alert(2)> 42", "steps": 2, "correct": True, "category": "a'b",
              "usage": {"prompt_tokens": 10, "completion_tokens": 5}, "cost_usd": 0.001, "latency_s": 0.5}]
    html = render_report(f"reactq eval: {name}", summarise(lines), lines)
    report_id = uuid.uuid4().hex
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    from_settings(client, cluster.settings()).save(tenant, report_id, name, html, {"questions": 1, "correct": 1})
    client.close()
    return report_id, html


@pytest.mark.integration
def test_eval_reports_are_listed_opened_escaped_and_kept_per_tenant(
        tenancy_cluster: Cluster, api_server: Callable[..., Api], tmp_path: Path) -> None:
    c = tenancy_cluster
    acme, other = make_key(c, "acme", "pro"), make_key(c, "other", "free")
    c.start_worker()
    stored_eval(c, tmp_path, 2)
    hostile_id, hostile_html = hostile_report(c, "acme", "hostile.jsonl")
    api = api_server()
    ui, _ = signed_in(api, acme)
    listing = ui.get("/ui/evals")
    assert listing.status_code == 200 and "subset.jsonl" in listing.text and "hostile.jsonl" in listing.text
    [stored] = re.findall(r'<tr data-report="([0-9a-f]{32})">\s*<td><a href="/ui/evals/\1">subset.jsonl', listing.text)
    page = ui.get(f"/ui/evals/{stored}")
    assert page.status_code == 200 and "2 of 2" in text_of(page.text)
    report = ui.get(f"/ui/evals/{stored}/report.html")
    assert report.status_code == 200 and report.text.startswith("<!doctype html>")
    assert "<style>" not in report.text and REPORT_LINKS in report.text
    assert report.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self'")
    assert report.text.replace(REPORT_LINKS, "") == \
        (tmp_path / "r.html").read_text().replace(f"<style>{eval_report.STYLE}</style>", "")
    css = ui.get("/ui/evals/report.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css") and "table{" in css.text
    hostile = ui.get(f"/ui/evals/{hostile_id}/report.html").text
    assert "<script>" not in hostile and "<img src=x" not in hostile
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hostile and "&lt;img src=x onerror=alert(2)&gt;" in hostile
    assert hostile == hostile_html.replace(f"<style>{eval_report.STYLE}</style>", REPORT_LINKS)

    theirs, _ = signed_in(api, other)
    assert "subset.jsonl" not in theirs.get("/ui/evals").text
    for path in (f"/ui/evals/{stored}", f"/ui/evals/{stored}/report.html", f"/ui/evals/{stored}?tenant=acme"):
        assert theirs.get(path).status_code == 404
    everyone, _ = signed_in(api, operator_key(c))
    assert f"/ui/evals/{stored}?tenant=acme" in everyone.get("/ui/evals").text
    assert everyone.get(f"/ui/evals/{stored}/report.html", params={"tenant": "acme"}).text == report.text
    assert everyone.get(f"/ui/evals/{stored}").status_code == 404  # which tenant's: the link says


@pytest.mark.integration
def test_ops_page_is_the_operators_and_shows_queues_and_the_workers_figures(
        tenancy_cluster: Cluster, api_server: Callable[..., Api], make_stub: Callable[..., StubServer]) -> None:
    c = tenancy_cluster
    # a provider whose first two answers are 429s (the worker's client tries again after Retry-After)
    c.env["REACTQ_LLM_BASE_URL"] = make_stub(FaultConfig(fail_first_n=2, fail_status=429, retry_after_s=0.2)).base_url
    c.env["REACTQ_MODELS"] = json.dumps({"reactq-stub": {"rpm": 60}})  # the limiter's cells, for its table
    acme = make_key(c, "acme", "pro")
    api = api_server()
    questions = [*(f"What is {i} + 1?" for i in range(4)), "What is 1 / 0?"]  # the last: a tool failure
    submitted = api.client(acme).post("/v1/batches", json={"runs": [{"question": q} for q in questions]})
    assert submitted.status_code == 201, submitted.text
    single = api.client(acme).post("/v1/runs", json={"question": "What is 2 + 2?"})
    assert single.status_code == 201, single.text
    tenant_ui, _ = signed_in(api, acme)
    refused = tenant_ui.get("/ui/ops")
    assert refused.status_code == 403 and "operator" in refused.text and 'id="queues"' not in refused.text
    ops, _ = signed_in(api, operator_key(c))
    page = ops.get("/ui/ops")
    assert page.status_code == 200
    row = re.search(r'<tr data-queue="reactq.steps">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    depths = [int(d) for d in re.findall(r'data-priority="\d">(\d+)<', row[1])]
    waiting = re.search(r'data-figure="depth">(\d+)<', row[1])
    assert waiting and int(waiting[1]) == sum(depths) == 6
    assert depths[0] == 1 and sum(depths[2:]) == 5  # the interactive run first, the batch's at 2 and below
    assert 'id="no-processes"' in page.text  # no worker yet
    limiter = re.search(r'<tr data-model="reactq-stub">(.*?)</tr>', page.text, re.S)
    assert limiter and "60 rpm" in limiter[1] and "0 ms (rpm)" in limiter[1]  # no call booked yet
    client = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    assert client.delete("reactq.steps") == 1  # the interactive run's message is lost: the reaper's to find
    client.close()

    c.start_worker()
    for run_id in [*submitted.json()["run_ids"], single.json()["run_id"]]:
        c.wait_for_run(run_id)

    def figures() -> str:
        text = ops.get("/ui/ops").text
        ended = re.search(r"Runs ended: (.*?)</p>", text, re.S)
        return text if ended and sum(map(int, re.findall(r" (\d+)", text_of(ended[1])))) == 6 else ""

    text = wait_for("the workers' figures on the operations page", figures, 60)
    row = re.search(r'<tr data-queue="reactq.steps">(.*?)</tr>', text, re.S)
    assert row and 'data-figure="depth">0<' in row[1]
    processes = text[text.index('id="processes"'):]
    assert "reactq.steps" in processes and "reactq.sandbox" in processes
    limiter = re.search(r'<tr data-model="reactq-stub">(.*?)</tr>', text, re.S)
    # a dozen calls at 60 rpm (one a second, half a second's burst) within a few seconds: some were held back
    assert limiter and re.search(r'<td class="wide">[^<]*\b(pacing|rpm) \d+', limiter[1]), text
    assert '<td data-figure="429">2</td>' in limiter[1]  # the provider's two 429s
    model = re.search(r'<table id="tokens-by-model">.*?<th scope="row">([^<]+)</th><td>[\d.]+</td><td>(\d+)</td>',
                      text, re.S)
    assert model and model[1] == c.settings().model and int(model[2]) > 0
    failures = re.search(r'<tr data-tool="calculator" data-kind="division_by_zero">.*?</td><td>(\d+)</td>', text, re.S)
    assert failures and failures[1] == "1"
    reaped = re.search(r'<tr data-action="lost_message"><th scope="row">lost_message</th><td>(\d+)</td>', text)
    assert reaped and reaped[1] == "1"  # the stranded run, re-kicked
    stranded = single.json()["run_id"]
    assert re.search(rf'<tr data-run="{stranded}">.*?<td>lost_message</td></tr>', text, re.S)


@pytest.mark.integration
def test_the_pages_under_insecure_no_auth(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    """`reactq api --insecure-no-auth` (loopback): the pages act for the loopback tenant without a sign-in."""
    api = api_server("--insecure-no-auth")
    client = api.client(None)
    batch = client.post("/v1/batches", json={"runs": [{"question": "What is 1 + 1?"}]}).json()["batch_id"]
    listing = client.get("/ui/batches")
    assert listing.status_code == 200 and f'data-batch="{batch}"' in listing.text
    page = client.get(f"/ui/batches/{batch}")
    assert page.status_code == 200 and "0 of 1 runs finished (0%)" in text_of(page.text)
    assert 'hx-trigger="every 5s"' in page.text  # unfinished (no worker): the page follows it
    assert client.get("/ui/evals").status_code == 200 and client.get("/ui/diff").status_code == 200
    assert client.get("/ui/ops").status_code == 403  # the loopback tenant is a tenant, not the operator
