"""Alerts reach someone: a real Prometheus evaluates the shipped rules and sends what fires to a real
Alertmanager (Debian's prometheus-alertmanager 0.25), which delivers it to a webhook receiver on loopback.
Also: the shipped alertmanager.yml (compose's file and the ConfigMap kustomize renders from it) passes
`amtool check-config`, both prometheus.yml send their alerts to the Alertmanager their deployment runs, and
the new alert rules pass their `promtool test rules` unit tests (tests/promtool/alerts.test.yml)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tests.fixtures_alerting import (
    ALERTMANAGER_CONFIG,
    acl_redis,
    alertmanager,
    check_alertmanager_config,
    prometheus,
    redis_exporter,
)
from tests.fixtures_cluster import ROOT
from tests.fixtures_k8s import kustomize
from tests.fixtures_prometheus import PROMETHEUS_DIR, config_for, promtool_binary
from tests.fixtures_receiver import Receiver
from tests.fixtures_services import free_port
from tests.test_compose_stack import Stack, _prometheus_config, stack_images_and_secrets, wait_until
from tests.test_deploy import SECRETS, compose_config

K8S_PROMETHEUS = ROOT / "deploy" / "k8s" / "base" / "prometheus" / "prometheus.yml"
PROMTOOL_TESTS = ROOT / "tests" / "promtool" / "alerts.test.yml"


def test_shipped_alertmanager_config_passes_amtool(tmp_path: Path) -> None:
    check_alertmanager_config(ALERTMANAGER_CONFIG)
    [configmap] = [o for o in kustomize("base") if o["kind"] == "ConfigMap"
                   and o["metadata"]["name"].startswith("alertmanager-config")]
    rendered = tmp_path / "alertmanager.yml"
    rendered.write_text(configmap["data"]["alertmanager.yml"])
    check_alertmanager_config(rendered)
    assert configmap["data"]["alertmanager.yml"] == ALERTMANAGER_CONFIG.read_text()  # one copy


def test_new_alert_rules_pass_their_promtool_unit_tests() -> None:
    done = subprocess.run([promtool_binary(), "test", "rules", str(PROMTOOL_TESTS)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {test["alertname"] for case in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
              for test in case["alert_rule_test"]}
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.rules.yml").read_text())["groups"]
    [group] = [g for g in rules if g["name"] == "reactq-redis-and-workers"]
    assert {r["alert"] for r in group["rules"]} <= tested  # every alert of the group has a unit test


def test_both_deployments_send_alerts_to_their_alertmanager() -> None:
    for path, target in ((PROMETHEUS_DIR / "prometheus.yml", "alertmanager:9093"),
                         (K8S_PROMETHEUS, "alertmanager.reactq.svc.cluster.local:9093")):
        [manager] = yaml.safe_load(path.read_text())["alerting"]["alertmanagers"]
        assert manager["static_configs"] == [{"targets": [target]}], path

    rendered = compose_config(SECRETS)
    assert rendered.returncode == 0, rendered.stderr
    service = yaml.safe_load(rendered.stdout)["services"]["alertmanager"]
    assert service["expose"] == ["9093"] and "ports" not in service
    assert any(str(v).endswith("deploy/alertmanager:/etc/alertmanager:ro") or
               (isinstance(v, dict) and v.get("target") == "/etc/alertmanager") for v in service["volumes"])
    dockerfile = (ROOT / service["build"]["dockerfile"]).read_text()
    assert "prometheus-alertmanager" in dockerfile and "--config.file=/etc/alertmanager/alertmanager.yml" in dockerfile

    objects = kustomize("base")
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "alertmanager"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    config_volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"].startswith("alertmanager-config")
    assert "--config.file=/etc/alertmanager/config/alertmanager.yml" in container["args"]
    [service_k8s] = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "alertmanager"]
    assert service_k8s["spec"]["ports"][0]["port"] == 9093
    # Prometheus may reach the Alertmanager and the Redis exporter (the namespace denies by default).
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for component, port in (("alertmanager", 9093), ("redis-exporter", 9121)):
        [policy] = [p for p in policies
                    if p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") == component]
        [rule] = policy["spec"]["ingress"]
        assert [p["port"] for p in rule["ports"]] == [port]
        assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]] == [
            "prometheus"]


def _rules_with_short_for(workdir: Path) -> Path:
    """A test copy of alerts.rules.yml: every `for:` is 1 s (the shipped 5 minutes would outlast the test)."""
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    path = workdir / "alerts.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    return path


def _fill(client: redis.Redis, ratio: float) -> float:
    """Write 128 KiB values until Redis uses more than `ratio` of its maxmemory; the ratio reached."""
    i = 0
    while True:
        memory = client.info("memory")
        used = memory["used_memory"] / memory["maxmemory"]
        if used > ratio:
            return float(used)
        client.set(f"reactq:fill:{i}", b"x" * 128 * 1024)
        i += 1


def _alerts(receiver: Receiver) -> list[dict[str, Any]]:
    return [dict(alert, receiver=body["receiver"]) for call in receiver.calls
            for body in [json.loads(call.body)] for alert in body["alerts"]]


@pytest.mark.integration
def test_a_firing_redis_memory_alert_reaches_the_webhook_receiver(tmp_path: Path, make_receiver: Any) -> None:
    """Redis (the shipped ACL, noeviction) filled past 80% of a small maxmemory; the real exporter, the
    shipped rules (`for:` shortened) and routing (its receiver's URL and group waits changed) deliver
    ReactqRedisMemoryHigh with its labels to the receiver."""
    receiver = make_receiver()
    am_config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    [operator] = [r for r in am_config["receivers"] if r["name"] == am_config["route"]["receiver"]]
    operator["webhook_configs"][0]["url"] = receiver.url
    am_config["route"].update(group_wait="1s", group_interval="1s")

    with acl_redis(tmp_path, maxmemory="8mb") as server, \
            redis_exporter(tmp_path, f"redis://127.0.0.1:{server.port}", "exporter", "pw-exporter") as exporter, \
            alertmanager(tmp_path, am_config) as manager:
        used = _fill(redis.Redis.from_url(server.url("api")), 0.85)
        assert 0.85 < used < 0.95  # the warning, not the critical alert

        config = config_for({"reactq-redis": [exporter.address]})
        config["rule_files"] = [str(PROMETHEUS_DIR / "recording.rules.yml"), str(_rules_with_short_for(tmp_path))]
        config["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [manager.url.removeprefix("http://")]}]}]
        with prometheus(tmp_path, config) as prom:
            calls = receiver.wait_for("ReactqRedisMemoryHigh", lambda _: any(
                a["labels"]["alertname"] == "ReactqRedisMemoryHigh" for a in _alerts(receiver)), timeout=60)
            assert prom.value('up{job="reactq-redis"}') == 1

    [alert] = [a for a in _alerts(receiver) if a["labels"]["alertname"] == "ReactqRedisMemoryHigh"]
    assert alert["status"] == "firing" and alert["receiver"] == "operator"
    assert alert["labels"] == {"alertname": "ReactqRedisMemoryHigh", "severity": "warning", "job": "reactq-redis",
                               "instance": exporter.address, "stack": "reactq"}  # stack: the external label
    assert alert["annotations"]["summary"].startswith(f"Redis {exporter.address} uses ")
    assert calls[0].path == "/hook"
    names = {a["labels"]["alertname"] for a in _alerts(receiver)}
    assert "ReactqRedisMemoryCritical" not in names and "ReactqRedisDown" not in names


@pytest.mark.docker
@pytest.mark.integration
def test_compose_prometheus_scrapes_the_exporter_and_alerts_reach_the_alertmanager(
        docker_engine: object, tmp_path: Path) -> None:
    """docker-compose.yml's redis, redis-exporter, alertmanager and prometheus (images built from Debian's
    packages, deploy/compose.test.yml): Prometheus scrapes Redis through the exporter as the `exporter` ACL
    user; Redis stopped, ReactqRedisDown (a test copy of the rules: `for:` 1 s) reaches the Alertmanager,
    as the documented `docker compose exec alertmanager amtool ... alert query` shows."""
    env = stack_images_and_secrets(tmp_path)
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    _prometheus_config(prom_dir)
    config = yaml.safe_load((prom_dir / "prometheus.yml").read_text())
    config["rule_files"] = ["/etc/prometheus/recording.rules.yml", "/etc/prometheus-test/alerts.rules.yml"]
    (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    _rules_with_short_for(prom_dir)
    port = free_port()
    env.update(REACTQ_TEST_PROMETHEUS_DIR=str(prom_dir), REACTQ_PROMETHEUS_PORT=str(port))
    stack = Stack(project=f"reactqalerts{os.getpid()}", env=env, api="", prometheus=f"http://127.0.0.1:{port}",
                  headers={})

    def query(expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{stack.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
        return list(r.raise_for_status().json()["data"]["result"])

    def alertmanager_alerts() -> list[dict[str, Any]]:
        out = stack.compose("exec", "-T", "alertmanager", "amtool", "--alertmanager.url=http://localhost:9093",
                            "alert", "query", "-o", "json", timeout=60)
        return list(json.loads(out))

    try:
        stack.compose("up", "-d", "--no-build", "redis", "redis-exporter", "alertmanager", "prometheus")
        up = wait_until("Prometheus to scrape Redis through the exporter",
                        lambda: query('redis_up{job="reactq-redis"}'), 120,
                        until=lambda r: [s["value"][1] for s in r] == ["1"])
        assert up[0]["metric"]["instance"] == "redis-exporter:9121"
        assert [s["value"][1] for s in query('redis_memory_max_bytes{job="reactq-redis"}')] == [str(2 * 1024 ** 3)]
        assert query('redis_errors_total{err="NOPERM"}') == []  # the exporter's commands all allowed
        stack.compose("stop", "redis", timeout=120)
        alerts = wait_until("ReactqRedisDown in the Alertmanager", alertmanager_alerts, 120,
                            until=lambda a: any(x["labels"]["alertname"] == "ReactqRedisDown" for x in a))
        [down] = [a for a in alerts if a["labels"]["alertname"] == "ReactqRedisDown"]
        assert down["labels"]["instance"] == "redis-exporter:9121" and down["labels"]["severity"] == "critical"
        assert [r["name"] for r in down["receivers"]] == ["operator"]  # the shipped route
    finally:
        stack.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=300)
