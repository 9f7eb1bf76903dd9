"""Health and shutdown (docs/decisions/worker-health.md): what the probes ask, and how long a stop may take.

- Real workers (`python -m worker.cli worker`) on real Redis answer /livez and /readyz on their metrics
  listener: ready once Celery consumes; not ready, yet alive, while Redis is down (a restart would not
  help); ready again once it is back; not ready while a sandbox backend is down or the worker drains.
- The liveness rule itself (no heartbeat while Redis answers: dead) on a clock the test moves.
- Every long-running workload of `kubectl kustomize deploy/k8s/base` has a liveness and a readiness probe,
  on the endpoints above; every compose service a healthcheck (`docker-compose config`, the real tool).
- Stop grace exceeds the drain timeout with margin, in the rendered manifests and the compose file.
"""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures_cluster import ROOT, Cluster, metrics_port
from tests.fixtures_k8s import kustomize
from tests.fixtures_sandbox import start_backendless_worker
from tests.fixtures_services import RedisServer
from tests.fixtures_stub import StubControl
from tests.test_deploy import SECRETS, compose_config
from tests.test_shutdown import sigterm, stub_in_flight
from tests.waiting import wait_for
from worker.config import Settings
from worker.runtime.metrics_server import WorkerHealth

STALE_S = 3
LONG_RUNNING = {"api", "step-worker", "sandbox-worker", "stub", "redis", "prometheus", "grafana"}


def probe(port: int, path: str) -> tuple[int, str]:
    response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
    return response.status_code, response.text.strip()


@pytest.mark.integration
def test_a_worker_stays_alive_but_not_ready_while_redis_is_down(own_redis: RedisServer, cluster: Cluster) -> None:
    cluster.env.update(REACTQ_REDIS_URL=own_redis.url, REACTQ_HEALTH_STALE_S=str(STALE_S))
    port = metrics_port()
    cluster.start_worker(queues="steps", concurrency=2, metrics_port=port)
    assert wait_for("the worker to be ready", lambda: probe(port, "/readyz"), 60,
                    until=lambda seen: seen[0] == 200) == (200, "ready")
    assert probe(port, "/livez") == (200, "consumer alive")
    assert probe(port, "/nope")[0] == 404
    time.sleep(2 * STALE_S)  # longer than a heartbeat may be missed: the consumer's own beats keep it live
    assert probe(port, "/livez") == (200, "consumer alive")
    assert probe(port, "/readyz") == (200, "ready")

    own_redis.stop()
    wait_for("/readyz to say Redis is gone", lambda: probe(port, "/readyz"), 60,
             until=lambda seen: seen[0] == 503)
    # the consumer's heartbeats stop while it reconnects; with Redis gone that is no reason to restart
    assert wait_for("/livez to wait for Redis", lambda: probe(port, "/livez"), 60,
                    until=lambda seen: seen[1] == "waiting for Redis")[0] == 200

    own_redis.start()
    wait_for("the worker to be ready again", lambda: probe(port, "/readyz"), 90, 0.5,
             until=lambda seen: seen[0] == 200)
    assert probe(port, "/livez") == (200, "consumer alive")


@pytest.mark.integration
def test_a_sandbox_worker_without_a_backend_is_alive_and_not_ready(cluster: Cluster) -> None:
    port = metrics_port()
    start_backendless_worker(cluster, metrics_port=port, REACTQ_SANDBOX_BACKEND="docker",
                             DOCKER_HOST="unix:///nonexistent/reactq-test/docker.sock")
    assert wait_for("/readyz to name the backend", lambda: probe(port, "/readyz"), 60,
                    until=lambda seen: seen[1] != "the consumer has not started") == \
        (503, "the sandbox backend cannot run code")
    assert probe(port, "/livez")[0] == 200


@pytest.mark.integration
def test_a_draining_worker_is_not_ready_and_not_restarted(cluster: Cluster, stub_control: StubControl,
                                                          tmp_path: Path) -> None:
    stub_control.set_faults(latency_ms=20000)  # a step in flight keeps the drain going
    port = metrics_port()
    worker = cluster.start_worker(queues="steps", concurrency=2, metrics_port=port, REACTQ_DRAIN_TIMEOUT_S="30")
    wait_for("the worker to be ready", lambda: probe(port, "/readyz"), 60, until=lambda seen: seen[0] == 200)
    infile = tmp_path / "in.jsonl"
    infile.write_text(json.dumps({"id": "q", "question": "What is 6 * 7?"}) + "\n")
    cluster.start_batch(infile, tmp_path / "out.jsonl")
    wait_for("an LLM call in flight", lambda: stub_in_flight(stub_control), 60)
    sigterm(worker)
    assert wait_for("/readyz to say it is shutting down", lambda: probe(port, "/readyz"), 30,
                    until=lambda seen: seen[0] == 503) == (503, "shutting down")
    assert probe(port, "/livez") == (200, "shutting down")


def test_liveness_fails_only_when_the_loop_stops_while_redis_answers() -> None:
    now = [100.0]
    health = WorkerHealth(clock=lambda: now[0])
    assert health.live(30, lambda: True) == (True, "starting")
    assert health.ready(30, lambda: True) == (False, "the consumer has not started")
    now[0] += 31
    assert health.live(30, lambda: True) == (False, "no consumer heartbeat for 31 s while Redis answers")
    assert health.live(30, lambda: False) == (True, "waiting for Redis")
    health.consuming(["reactq.steps"])
    assert health.live(30, lambda: True) == (True, "consumer alive")
    assert health.ready(30, lambda: True) == (True, "ready")
    assert health.ready(30, lambda: False) == (False, "Redis is unreachable")
    now[0] += 40
    assert health.live(30, lambda: True)[0] is False
    assert health.ready(30, lambda: True) == (False, "no consumer heartbeat for 40 s")
    health.stopping()
    assert health.live(30, lambda: True) == (True, "shutting down")
    assert health.ready(30, lambda: True) == (False, "shutting down")


# --- the manifests and the compose file ---------------------------------------------------------------

def _workloads() -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in kustomize("base") if o["kind"] in ("Deployment", "StatefulSet")}


def _main_container(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]["containers"][0]


def test_every_long_running_workload_has_liveness_and_readiness_probes() -> None:
    workloads = _workloads()
    assert LONG_RUNNING <= set(workloads)
    for name in LONG_RUNNING:
        container = _main_container(workloads[name])
        assert container.get("livenessProbe") and container.get("readinessProbe"), name
    for name in ("step-worker", "sandbox-worker"):
        container = _main_container(workloads[name])
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}, name
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, name
        assert container["envFrom"][0] == {"configMapRef": {"name": "reactq-env"}}, name
    config = next(o for o in kustomize("base") if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "reactq-env")
    assert config["data"]["REACTQ_METRICS_HOST"] == "0.0.0.0"  # the kubelet and Prometheus come by pod IP
    api = _main_container(workloads["api"])
    assert api["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert api["readinessProbe"]["httpGet"]["path"] == "/healthz"  # 503 while Redis is unreachable


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    total, number = 0.0, ""
    for char in duration:
        if char.isdigit() or char == ".":
            number += char
        else:
            total, number = total + float(number) * units[char], ""
    return total + (float(number) if number else 0)


def test_stop_grace_exceeds_the_drain_with_margin() -> None:
    """SIGKILL must not race the drain: the kubelet's and compose's grace both leave the drain 30 s spare; a
    sandbox worker's also the longest execution a tier allows (its warm shutdown waits for those)."""
    default_drain = Settings.model_fields["drain_timeout_s"].default
    tiers = tomllib.loads((ROOT / "deploy" / "sandbox" / "tiers.toml").read_text())
    longest = {"step-worker": 0, "sandbox-worker": max(t["wall_time_s"] for t in tiers["tiers"].values())}
    workloads = _workloads()
    for name in ("step-worker", "sandbox-worker"):
        spec = workloads[name]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for c in spec["containers"] for e in c.get("env", [])}
        drain = float(env.get("REACTQ_DRAIN_TIMEOUT_S") or default_drain)
        assert spec["terminationGracePeriodSeconds"] >= longest[name] + drain + 30, name
    rendered = compose_config(SECRETS)
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(rendered.stdout)["services"]
    for name in ("step-worker", "sandbox-worker"):
        drain = float(services[name]["environment"].get("REACTQ_DRAIN_TIMEOUT_S") or default_drain)
        assert _seconds(services[name]["stop_grace_period"]) >= longest[name] + drain + 30, name


def test_every_compose_service_has_a_healthcheck_and_waits_for_what_it_needs() -> None:
    rendered = compose_config(SECRETS)
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(rendered.stdout)["services"]
    for name in LONG_RUNNING | {"dind"}:  # the long-running services of this file (sandbox-image is one-shot)
        assert services[name].get("healthcheck", {}).get("test"), name
    for name in ("api", "step-worker", "sandbox-worker"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
    assert services["sandbox-worker"]["depends_on"]["dind"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    for name in ("step-worker", "sandbox-worker"):
        assert "/livez" in " ".join(services[name]["healthcheck"]["test"]), name
    assert "--user" in " ".join(services["redis"]["healthcheck"]["test"])  # no passwordless default user
