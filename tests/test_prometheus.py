"""The shipped Prometheus config, rules and Grafana dashboard, checked against a real Prometheus.

`test_every_promql_expression_evaluates` starts /usr/bin/prometheus scraping a step worker, a sandbox
worker, the API and the stub (each on a free port), runs a workload that feeds every panel, then asks
Prometheus's HTTP API for every expression of the dashboard and the rule files.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import REGISTRY

from tests.fixtures_api import make_key
from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_prometheus import PROMETHEUS_DIR, PromQLError, promtool_binary
from tests.fixtures_services import free_port
from tests.test_metrics import BATCH, exhaust_quota, run_batch
from tests.waiting import wait_for

GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))
K8S_PROMETHEUS = ROOT / "deploy" / "k8s" / "base" / "prometheus" / "prometheus.yml"
RULE_FILES = [PROMETHEUS_DIR / "recording.rules.yml", PROMETHEUS_DIR / "alerts.rules.yml"]

# What Grafana substitutes in the dashboard's queries; the test's scrapes are 1 s apart.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "1s", "$namespace": ".*", "$job": ".*"}

# Expressions that legitimately return nothing in a healthy test: alert conditions (nothing is wrong).
# They must still parse and evaluate without error.
MAY_BE_EMPTY = {
    "alert ReactqToolFailureRateHigh": "fires only after minutes of sustained failures with enough traffic",
    "alert ReactqRunsStuck": "runs are moving",
    "alert ReactqQueueGrowing": "queues are short",
    "alert ReactqQuotaRejectionsSpiking": "one rejection is not a spike",
    "alert ReactqLLMErrorRateHigh": "the stub answers every call",
    "alert ReactqLLMCircuitOpen": "the stub answers every call: no circuit opens",
    "alert ReactqWorkerDown": "every worker is up (checked separately after stopping one)",
    # Panels of mechanisms this workload does not set off.
    "reactq-overview.json / Limiter: calls held back / A": "no provider limit is configured",
    "reactq-overview.json / Limiter wait p95 / A": "no provider limit is configured, so no call waits for a slot",
    "reactq-overview.json / Fallbacks to another model / A": "no fallback model is configured",
    "reactq-overview.json / Warm containers retired by reason / A": "only the Docker backend keeps warm containers",
    "reactq-overview.json / Warm containers / A": "only the Docker backend keeps warm containers (tests use process)",
    # No Redis exporter in this test: tests/test_alertmanager.py and tests/test_redis_exporter.py run one.
    "reactq-overview.json / Redis memory used of its limit / A": "no Redis exporter here",
    "reactq-overview.json / Redis clients / A": "no Redis exporter here",
    "reactq-overview.json / Redis clients / B": "no Redis exporter here",
    "reactq-overview.json / Redis up and rejected connections / A": "no Redis exporter here",
    "reactq-overview.json / Redis up and rejected connections / B": "no Redis exporter here",
    "alert ReactqRedisMemoryHigh": "no Redis exporter here",
    "alert ReactqRedisMemoryCritical": "no Redis exporter here",
    "alert ReactqRedisDown": "no Redis exporter here",
    "alert ReactqRedisExporterDown": "no Redis exporter here",
    "alert ReactqRedisClientsNearLimit": "no Redis exporter here",
    "alert ReactqRedisRejectingConnections": "no Redis exporter here",
    # A Redis Cluster's: evaluated on a real cluster, exporter and Prometheus in tests/test_redis_cluster_deploy.py.
    "reactq-overview.json / Memory per shard / A": "no Redis Cluster here",
    "reactq-overview.json / Commands per second per shard / A": "no Redis Cluster here",
    "reactq-overview.json / CPU per shard (cores) / A": "no Redis Cluster here",
    "alert ReactqRedisClusterDown": "no Redis Cluster here",
    "alert ReactqRedisFailover": "no Redis Cluster here",
    "alert ReactqRedisPrimaryWithoutReplica": "no Redis Cluster here",
    "alert ReactqSandboxBackendDown": "the sandbox backend is up",
    "alert ReactqToolStuckThreadsHigh": "no tool thread outlives its deadline",
}


def dashboard_expressions() -> dict[str, str]:
    found: dict[str, str] = {}

    def walk(panels: list[dict[str, Any]], dashboard: str) -> None:
        for panel in panels:
            walk(panel.get("panels", []), dashboard)
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(variable, value)
                assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
                found[f"{dashboard} / {panel['title']} / {target['refId']}"] = expr

    for path in DASHBOARDS:
        walk(json.loads(path.read_text())["panels"], path.name)
    return found


def rule_expressions() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = f"alert {rule['alert']}" if "alert" in rule else f"record {rule['record']}"
                found[name] = rule["expr"]
    return found


def exported_names() -> set[str]:
    """Every sample name this project's processes export (worker, sandbox, and the stub's own registry)."""
    import tools_sandbox.base.metrics  # noqa: F401 - registers the sandbox metrics
    import worker.metrics  # noqa: F401
    from api_stub.server import _Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for family in [*REGISTRY.collect(), *_Metrics().registry.collect()]:
        if family.name.startswith("reactq_"):
            names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def test_shipped_files_pass_promtool() -> None:
    promtool = promtool_binary()
    for args in (["check", "config", str(PROMETHEUS_DIR / "prometheus.yml")],
                 ["check", "config", str(K8S_PROMETHEUS)],
                 ["check", "rules", *map(str, RULE_FILES)]):
        result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_compose_and_kubernetes_scrape_the_same_jobs() -> None:
    """The alert rules and the dashboard name jobs; both deployments must use those names."""
    jobs = [{job["job_name"] for job in yaml.safe_load(path.read_text())["scrape_configs"]}
            for path in (PROMETHEUS_DIR / "prometheus.yml", K8S_PROMETHEUS)]
    assert jobs[0] == jobs[1]
    assert {"reactq-api", "reactq-step-worker", "reactq-sandbox-worker", "reactq-stub"} <= jobs[0]


def test_queries_use_only_exported_metrics() -> None:
    """The dashboard's data source (a variable) and its metric coverage: tests/test_dashboard.py."""
    exported = exported_names() | {"up"}
    recorded = {rule["record"] for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
                for rule in group["rules"] if "record" in rule}
    assert "reactq_llm_cost_usd_total" in exported and "reactq_queue_depth" in exported
    for where, expr in {**dashboard_expressions(), **rule_expressions()}.items():
        names = set(re.findall(r"\b(reactq[:_][a-z0-9_:]+|redis_[a-z0-9_]+|up)\b(?!\s*\()", expr))
        assert names, f"{where}: no metric in {expr!r}"
        # redis_*: the Redis exporter's, checked against a real one in tests/test_redis_exporter.py
        unknown = {n for n in names - exported - recorded if not n.startswith("redis_")}
        assert not unknown, f"{where}: {unknown} are not exported by reactq"


@pytest.mark.integration
def test_every_promql_expression_evaluates(cluster: Cluster, tmp_path: Path, redis_url: str, stub_server: Any,
                                           start_prometheus: Any, start_api: Any) -> None:
    step_port, sandbox_port = free_port(), free_port()
    cluster.start_worker(queues="steps", metrics_port=step_port)
    sandbox_worker = cluster.start_worker(queues="sandbox", metrics_port=sandbox_port, concurrency=4)
    auth = {"Authorization": f"Bearer {make_key(cluster, 'default')}"}  # `reactq api` needs a tenant
    api_url = start_api()
    targets = {
        "reactq-step-worker": [f"127.0.0.1:{step_port}"],
        "reactq-sandbox-worker": [f"127.0.0.1:{sandbox_port}"],
        "reactq-api": [api_url.removeprefix("http://")],
        "reactq-stub": [stub_server.url.removeprefix("http://")],
    }
    prom = start_prometheus(targets)
    for job in targets:
        prom.wait_for(f'up{{job="{job}"}}', lambda v: v == 1, timeout=90)

    # Workload: a batch with inline tools, a sandbox run, a failing calculator call and a quota
    # rejection, plus one run submitted through the HTTP API.
    exhaust_quota(redis_url, "free", "acme")
    created = httpx.post(f"{api_url}/v1/runs", json={"question": "What is 2 to the power of 10?"}, timeout=10,
                         headers=auth)
    assert created.status_code == 201, created.text
    results = run_batch(cluster, tmp_path, BATCH)
    api_run = created.json()["run_id"]
    wait_for(f"the API run {api_run} to finish",
             lambda: httpx.get(f"{api_url}/v1/runs/{api_run}", timeout=10, headers=auth).json()["status"], 60, 0.2,
             until=lambda status: status not in ("queued", "running"))

    finished = len(results) + 1
    prom.wait_for("sum(reactq_runs_total)", lambda v: v == finished)
    prom.wait_for("sum(reactq_quota_rejections_total)", lambda v: v == 1)
    prom.wait_for("sum(reactq_tool_failures_total)", lambda v: v is not None and v >= 2)
    # A series born with the failures needs two scrapes before rate() sees it.
    prom.wait_for("sum(rate(reactq_tool_failures_total[1m]))", lambda v: v is not None)
    prom.wait_for("sum(reactq_stub_requests_total)", lambda v: v is not None and v > 0)
    # Recording rules evaluated after the last scrape (evaluation every second).
    prom.wait_for("sum(reactq:runs_finished:rate5m)", lambda v: v is not None and v > 0)
    prom.wait_for('reactq:runs_in_progress:max', lambda v: v == 0)
    # Every target scraped twice more, so each series born during the workload has two samples for rate().
    settled = time.time() + 2.5
    prom.wait_for("min(timestamp(up))", lambda v: v is not None and v > settled)

    expressions = {**dashboard_expressions(), **rule_expressions()}
    assert len(expressions) > 30
    errors, empty = [], []
    for where, expr in expressions.items():
        try:
            result = prom.query(expr)
        except PromQLError as exc:
            errors.append(f"{where}: {exc.kind}: {exc.message}\n    {expr}")
            continue
        if not result and where not in MAY_BE_EMPTY:
            empty.append(f"{where}: no data\n    {expr}")
    assert not errors, "expressions that fail in Prometheus:\n" + "\n".join(errors)
    assert not empty, "expressions the workload should have fed but that return nothing:\n" + "\n".join(empty)
    assert set(MAY_BE_EMPTY) <= set(expressions), "the allow-list names rules that no longer exist"

    # Prometheus itself evaluated every rule without error, and the recorded series exist.
    groups = prom.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(rule_expressions())
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    for name in (r["name"] for r in rules if r["type"] == "recording"):
        assert prom.query(name), f"recording rule {name} produced no series"

    # Figures in Prometheus agree with the batch output (summed over all processes).
    tokens = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in results)
    assert prom.value("sum(reactq_llm_tokens_total)") > tokens  # plus the API-submitted run
    assert prom.value('sum(reactq_tool_failures_total{tool="calculator", error_type="division_by_zero"})') == 1
    assert prom.value('sum(reactq_quota_rejections_total{tier="free", quota="cpu_seconds_per_day"})') == 1
    assert prom.query('reactq_sandbox_executions_total{job="reactq-sandbox-worker", tier="standard", outcome="ok"}')

    # The worker-down alert's condition holds once a worker stops answering.
    cluster.kill(sandbox_worker)
    worker_down = rule_expressions()["alert ReactqWorkerDown"]
    prom.wait_for(f"count({worker_down})", lambda v: v == 1)
    assert [r["metric"]["job"] for r in prom.query(worker_down)] == ["reactq-sandbox-worker"]
