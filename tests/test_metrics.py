"""Exported metrics and structured logs tell the same story as the batch results.

One small batch runs once for the module on a real `reactq worker` (steps and sandbox queues, threads
pool); focused tests then check its /metrics against the batch's results and traces: token and cost
counters equal the runs' usage, a calculator division by zero and a sandbox quota rejection show up
with the right labels, runs are counted by status, labels stay bounded, logs agree.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from api_stub import StubServer
from tests.fixtures_cluster import Cluster, cluster_environment
from tests.fixtures_prometheus import Samples, promtool_binary, scrape, series, total
from tests.fixtures_services import RedisServer, free_port
from tests.waiting import wait_for
from tools_sandbox.base import keys as sandbox_keys
from worker import logs, metrics

BATCH = [
    {"id": "calc", "question": "What is (17 + 25) * 3?"},
    {"id": "search", "question": "What is the capital of Australia?", "tenant": "acme"},
    {"id": "python", "question": "What is the 30th Fibonacci number?"},
    {"id": "div0", "question": "What is 1 / 0?"},
    {"id": "quota", "question": "Reverse the string 'reactq'", "tenant": "acme", "tier": "free"},
    {"id": "divided", "question": "What is 144 divided by 12?", "tenant": "acme"},
]


def exhaust_quota(redis_url: str, tier: str, tenant: str) -> None:
    """Use up the tenant's CPU-seconds of today and tomorrow, so its next sandbox call is refused (the only
    quota that refuses: over concurrency or the per-minute rate a call waits in line instead)."""
    client = redis.Redis.from_url(redis_url)
    today = int(time.time() // 86400)
    for day in (today, today + 1):
        client.set(sandbox_keys.quota_cpu_day(tier, tenant, day), 1_000_000, ex=3 * 86400)
    client.close()


def run_batch(cluster: Cluster, tmp_path: Path, lines: list[dict]) -> list[dict]:
    """Run `lines` as one `reactq batch` per tenant (a batch belongs to one tenant), together."""
    tenants = sorted({line.get("tenant", "default") for line in lines})
    batches = []
    for tenant in tenants:
        infile, outfile = tmp_path / f"in-{tenant}.jsonl", tmp_path / f"out-{tenant}.jsonl"
        infile.write_text("".join(json.dumps(line) + "\n" for line in lines
                                  if line.get("tenant", "default") == tenant))
        batches.append((cluster.start_batch(infile, outfile), outfile))
    results = []
    for batch, outfile in batches:
        log = cluster.finish_batch(batch, timeout=180)
        assert outfile.exists(), log
        results += [json.loads(line) for line in outfile.read_text().splitlines()]
    assert sorted(r["id"] for r in results) == sorted(line["id"] for line in lines)
    return results


def wait_for_sample(url: str, name: str, value: float, timeout: float = 60, **labels: str) -> Samples:
    """Scrape until `name{labels}` sums to `value`; raise naming the series and its last value."""
    return wait_for(f"{name}{labels or ''} == {value} at {url}", lambda: scrape(url), timeout, 0.2,
                    until=lambda samples: total(samples, name, **labels) == value,
                    show=lambda samples: total(samples, name, **labels))


@dataclass(frozen=True)
class MeteredBatch:
    """What one batch on a real worker left behind: its results, traces, /metrics before and after, logs."""

    results: dict[str, dict]
    traces: dict[str, list[dict]]
    before: Samples
    after: Samples
    log_lines: list[dict]
    expositions: dict[str, str]  # the worker's and the stub's /metrics text after the batch

    @property
    def steps(self) -> int:
        return sum(r["steps"] for r in self.results.values())

    def tokens(self, kind: str, tenant: str | None = None) -> int:
        return sum(r["usage"][f"{kind}_tokens"] for r in self.results.values()
                   if tenant is None or TENANT_OF[r["id"]] == tenant)

    def tool_calls(self, tool: str) -> int:
        return sum(1 for steps in self.traces.values() for step in steps
                   for call in step["tool_calls"] if call["name"] == tool)


TENANT_OF = {line["id"]: line.get("tenant", "default") for line in BATCH}


@pytest.fixture(scope="module")
def metered(stub_server: StubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeteredBatch]:
    """The batch above, once for the module, on its own redis-server and a steps+sandbox worker."""
    redis_server = RedisServer(tmp_path_factory.mktemp("metrics-redis"))
    redis_server.start()
    tmp_path = tmp_path_factory.mktemp("metrics-batch")
    cluster = Cluster(cluster_environment(redis_server.url, stub_server.base_url), tmp_path)
    try:
        port = free_port()
        cluster.start_worker(queues="steps,sandbox", metrics_port=port)
        url = f"http://127.0.0.1:{port}/metrics"
        before = scrape(url)
        exhaust_quota(redis_server.url, "free", "acme")
        results = {r["id"]: r for r in run_batch(cluster, tmp_path, BATCH)}
        # The reaper samples Redis gauges every second (REACTQ_REAPER_INTERVAL_S=1).
        after = wait_for_sample(url, "reactq_runs_in_progress", 0)
        traces = {r["id"]: json.loads(cluster.reactq("trace", r["run_id"], "--json", check=True).stdout)["trace"]
                  for r in results.values()}
        log_lines = [json.loads(line) for line in (cluster.logdir / "worker-0.log").read_text().splitlines()
                     if line.startswith("{")]
        expositions = {"worker": httpx.get(url, timeout=10).text,
                       "stub": httpx.get(f"{stub_server.url}/metrics", timeout=10).text}
        yield MeteredBatch(results, traces, before, after, log_lines, expositions)
    finally:
        cluster.stop()
        redis_server.stop()


@pytest.mark.integration
def test_every_dashboard_series_exists_from_the_first_scrape(metered: MeteredBatch) -> None:
    assert total(metered.before, "reactq_llm_tokens_total") == 0
    assert {"status": "succeeded"} in series(metered.before, "reactq_runs_total")
    assert {"tier": "free", "quota": "cpu_seconds_per_day"} in series(metered.before,
                                                                         "reactq_quota_rejections_total")
    assert {"tier": "standard", "outcome": "ok"} in series(metered.before, "reactq_sandbox_executions_total")
    assert {s["queue"] for s in series(metered.after, "reactq_queue_depth")} == {"reactq.steps", "reactq.sandbox"}


@pytest.mark.integration
def test_live_scrapes_pass_promtool_check_metrics(metered: MeteredBatch) -> None:
    """Prometheus's own linter on what a worker and the stub serve after real work (names, suffixes, help)."""
    for process, text in metered.expositions.items():
        assert "reactq_" in text, process
        done = subprocess.run([promtool_binary(), "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (process, done)


@pytest.mark.integration
def test_token_counters_equal_the_runs_usage(metered: MeteredBatch) -> None:
    samples = metered.after
    prompt, completion = metered.tokens("prompt"), metered.tokens("completion")
    assert prompt > 0 and completion > 0
    assert total(samples, "reactq_llm_tokens_total", type="prompt") == prompt
    assert total(samples, "reactq_llm_tokens_total", type="completion") == completion
    for tenant in ("default", "acme"):
        usage = metered.tokens("prompt", tenant) + metered.tokens("completion", tenant)
        assert total(samples, "reactq_llm_tokens_total", tenant=tenant) == usage, tenant
    # Unconfigured tenants are refused at submit; their label would be "other" (initialised at 0).
    assert total(samples, "reactq_llm_tokens_total", tenant="other") == 0
    assert {s["tenant"] for s in series(samples, "reactq_llm_tokens_total")} == {"default", "acme", "other"}


@pytest.mark.integration
def test_cost_counter_equals_the_runs_cost(metered: MeteredBatch) -> None:
    cost = sum(r["cost_usd"] for r in metered.results.values())
    assert cost > 0
    assert total(metered.after, "reactq_llm_cost_usd_total") == pytest.approx(cost, rel=1e-6, abs=1e-7)


@pytest.mark.integration
def test_one_llm_call_per_recorded_step(metered: MeteredBatch) -> None:
    """A step continued after the sandbox reuses its stored reply: no second call."""
    samples, steps = metered.after, metered.steps
    assert total(samples, "reactq_llm_requests_total", outcome="ok") == steps
    assert total(samples, "reactq_llm_requests_total") == steps
    assert total(samples, "reactq_llm_request_duration_seconds_count") == steps
    assert total(samples, "reactq_steps_total") == steps


@pytest.mark.integration
def test_runs_are_counted_by_status_with_their_turns(metered: MeteredBatch) -> None:
    samples = metered.after
    statuses = Counter(r["status"] for r in metered.results.values())
    for status, count in statuses.items():
        assert total(samples, "reactq_runs_total", status=status) == count, status
        assert total(samples, "reactq_run_turns_count", status=status) == count, status
        assert total(samples, "reactq_run_duration_seconds_count", status=status) == count, status
    assert total(samples, "reactq_runs_total") == len(BATCH)
    assert total(samples, "reactq_run_turns_sum") == metered.steps


@pytest.mark.integration
def test_tool_calls_and_an_inline_failure_are_labelled(metered: MeteredBatch) -> None:
    samples = metered.after
    assert "zero" in (metered.results["div0"]["answer"] or "").lower(), metered.results["div0"]
    assert total(samples, "reactq_tool_failures_total", tool="calculator", error_type="division_by_zero") == 1
    assert total(samples, "reactq_tool_failures_total", tool="calculator") == 1
    assert total(samples, "reactq_tool_calls_total", tool="calculator", outcome="error") == 1
    for tool in ("calculator", "search", "python"):
        assert metered.tool_calls(tool) > 0, tool
        assert total(samples, "reactq_tool_calls_total", tool=tool) == metered.tool_calls(tool), tool


@pytest.mark.integration
def test_a_quota_rejection_is_counted_by_both_workers(metered: MeteredBatch) -> None:
    """The sandbox side counts the refusal; the step side counts a python tool failure."""
    samples = metered.after
    assert total(samples, "reactq_quota_rejections_total", tier="free", quota="cpu_seconds_per_day") == 1
    assert total(samples, "reactq_quota_rejections_total") == 1
    assert total(samples, "reactq_sandbox_executions_total", tier="free", outcome="quota_exceeded") == 1
    assert total(samples, "reactq_tool_failures_total", tool="python", error_type="quota_exceeded") == 1
    assert total(samples, "reactq_sandbox_executions_total", tier="standard", outcome="ok") == 1
    assert total(samples, "reactq_sandbox_duration_seconds_count", tier="standard") == 1


@pytest.mark.integration
def test_labels_are_bounded(metered: MeteredBatch) -> None:
    """Never a run id, a question or a tenant that is not configured."""
    run_ids = {r["run_id"] for r in metered.results.values()}
    questions = {line["question"] for line in BATCH}
    for _name, labels in metered.after:
        for value in dict(labels).values():
            assert value not in run_ids and value not in questions


@pytest.mark.integration
def test_logs_tell_the_same_story(metered: MeteredBatch) -> None:
    """One JSON line per step, and the run id on every line of a task."""
    run_ids = {r["run_id"] for r in metered.results.values()}
    step_lines = [line for line in metered.log_lines if line.get("logger") == "reactq.step" and line["msg"] == "step"]
    assert len(step_lines) == metered.steps
    assert {line["run_id"] for line in step_lines} == run_ids
    for line in step_lines:
        assert {"step", "outcome", "tools", "prompt_tokens", "completion_tokens", "llm_ms", "tools_ms"} <= set(line)
    tokens = metered.tokens("prompt") + metered.tokens("completion")
    assert sum(line["prompt_tokens"] + line["completion_tokens"] for line in step_lines) == tokens
    task_lines = [line for line in metered.log_lines if line.get("logger") == "celery.app.trace"]
    assert task_lines, "expected Celery's per-task lines in the worker log"
    for line in task_lines:
        assert line.get("run_id") in run_ids and "step" in line, line


# --- fast tests: no processes ---------------------------------------------------------------------


def test_tenant_label_is_bounded() -> None:
    assert metrics.tenant_label("acme", ["default", "acme"]) == "acme"
    assert metrics.tenant_label("somebody's free text", ["default", "acme"]) == "other"


def test_error_type_label_is_bounded() -> None:
    assert metrics.error_type_label("division_by_zero") == "division_by_zero"
    assert metrics.error_type_label("web search failed with HTTP 503") == "other"
    assert metrics.error_type_label("x" * 80) == "other"


def test_task_fields_name_the_run_and_step() -> None:
    assert logs.task_fields("reactq.step", ["r1", 3]) == {"run_id": "r1", "step": 3}
    sandbox_request = {"code": "print(1)", "result_key": "k", "continue_args": ["r2", 1]}
    assert logs.task_fields("reactq.sandbox.execute", [sandbox_request]) == {"run_id": "r2", "step": 1}
    assert logs.task_fields("reactq.sandbox.execute", [{"code": "x"}]) == {}
    assert logs.task_fields("other.task", ["r1", 3]) == {}


def test_bound_fields_reach_every_logger_and_record_fields_win() -> None:
    formatter = logs.JsonFormatter()

    def line(name: str, **extra: object) -> dict:
        record = logging.LogRecord(name, logging.INFO, __file__, 1, "hello", None, None)
        record.__dict__.update(extra)
        return json.loads(formatter.format(record))

    assert "run_id" not in line("anything")
    with logs.bound(run_id="r1", step=2):
        assert line("some.library")["run_id"] == "r1"
        assert line("reactq.step", step=5)["step"] == 5
    assert "run_id" not in line("anything")


@pytest.mark.integration
def test_safeguards_are_counted(cluster: Cluster, tmp_path: Path) -> None:
    port = free_port()
    cluster.start_worker(queues="steps", metrics_port=port, REACTQ_OBSERVATION_MAX_CHARS="100")
    lines = [
        {"id": "capped", "question": "What is 3 * 4?", "max_steps": 1},
        {"id": "long", "question": "Who wrote Pride and Prejudice?"},  # search results exceed 100 chars
    ]
    results = {r["id"]: r for r in run_batch(cluster, tmp_path, lines)}
    assert results["capped"]["status"] == "max_steps" and results["capped"]["partial"] is True  # batch output line
    trace = json.loads(cluster.reactq("trace", results["long"]["run_id"], "--json", check=True).stdout)["trace"]
    truncated = sum(1 for step in trace for obs in step["observations"] if "…[truncated " in obs["content"])
    assert truncated > 0
    samples = wait_for_sample(f"http://127.0.0.1:{port}/metrics", "reactq_safeguards_total", 1, kind="max_steps")
    assert total(samples, "reactq_safeguards_total", kind="max_steps") == 1
    assert total(samples, "reactq_safeguards_total", kind="observation_truncated") == truncated
    assert {"kind": "loop"} in series(samples, "reactq_safeguards_total")  # initialised, so rate() exists
