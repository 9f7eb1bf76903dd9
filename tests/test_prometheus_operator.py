"""deploy/k8s/prometheus-operator, rendered by the real kustomize (`kubectl kustomize`), against the Prometheus
Operator's own CRD schemas (v0.93.0, vendored in tests/schemas) and against the base it scrapes:

- every object is in namespace reactq; the NetworkPolicy passes kubernetes-validate;
- each ServiceMonitor selects exactly one metrics Service of the base, by a port that Service has, and names
  the job as deploy/prometheus/prometheus.yml does;
- the PrometheusRule's groups are the rule files' groups (scripts/prometheus_rule.py writes it);
- promtool accepts the PrometheusRule's rules, and `promtool test rules` shows the alerts fit the operator's
  labels: worker-down matches its job names too, runs-stuck keeps installations in different namespaces apart.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.fixtures_cluster import ROOT
from tests.fixtures_k8s import NAMESPACE, kustomize
from tests.fixtures_prometheus import PROMETHEUS_DIR, promtool_binary

SCHEMAS = ROOT / "tests" / "schemas" / "prometheus-operator-0.93.0"
RULE_FILES = [PROMETHEUS_DIR / "recording.rules.yml", PROMETHEUS_DIR / "alerts.rules.yml"]
COMPONENTS = ("api", "step-worker", "sandbox-worker", "stub")
BUILD = "prometheus-operator"


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD schema rejecting unknown fields, as the API server's strict field validation does (a structural
    schema prunes them silently otherwise): no extra keys where `properties` lists the allowed ones."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    # Go's regexp (the API server's) takes `^(?i)...`; Python's wants a global flag first: same pattern.
    text = json.dumps(schema).replace('"^(?i)', '"(?i)^')
    schema = json.loads(text)
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by the API server, not the CRD
    return schema


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict openAPIV3Schema of each vendored CRD version."""
    found = {}
    for path in sorted(SCHEMAS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == "0.93.0", path.name
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            found[key] = strict(version["schema"]["openAPIV3Schema"])
    return found


OBJECTS = kustomize(BUILD)
BASE = kustomize("base")


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in OBJECTS if d["kind"] == kind]


def test_the_overlay_renders_its_objects_in_namespace_reactq() -> None:
    assert sorted(d["kind"] for d in OBJECTS) == ["NetworkPolicy", "PrometheusRule", *["ServiceMonitor"] * 5]
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in OBJECTS)
    assert not [d for d in OBJECTS if d in BASE]  # applied next to the base (or an overlay), not a copy of it


@pytest.mark.parametrize("doc", [pytest.param(d, id=f"{d['kind']}/{d['metadata']['name']}") for d in OBJECTS])
def test_object_is_valid_against_its_schema(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        schema = crd_schemas()[(doc["apiVersion"], doc["kind"])]
        jsonschema.validate(doc, schema, cls=jsonschema.Draft7Validator)
    else:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_the_strict_schemas_reject_what_the_operator_would_not_take() -> None:
    """The validation above can fail: an unknown field, a bad duration, a missing selector."""
    schemas = crd_schemas()
    [monitor] = [d for d in of_kind("ServiceMonitor") if d["metadata"]["name"] == "reactq-api"]
    [rule] = of_kind("PrometheusRule")
    broken = [copy.deepcopy(monitor) for _ in range(3)] + [copy.deepcopy(rule)]
    broken[0]["spec"]["endpoints"][0]["scrapeInterval"] = "15s"  # the field is `interval`
    broken[1]["spec"]["endpoints"][0]["interval"] = "15 seconds"
    del broken[2]["spec"]["selector"]
    broken[3]["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    for doc in broken:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schemas[(doc["apiVersion"], doc["kind"])], cls=jsonschema.Draft7Validator)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_each_service_monitor_scrapes_one_metrics_service_under_the_shipped_job_name() -> None:
    compose_jobs = {j["job_name"] for j in yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
                    ["scrape_configs"]}
    services = [d for d in BASE if d["kind"] == "Service"]
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in BASE if d["kind"] == "Deployment"}
    monitors = {d["metadata"]["name"]: d for d in of_kind("ServiceMonitor")}
    assert sorted(monitors) == sorted([*(f"reactq-{c}" for c in COMPONENTS), "reactq-redis"])
    # The Redis exporter: its Service redis-exporter, under compose's job name reactq-redis.
    exporter = monitors["reactq-redis"]["spec"]
    [exporter_service] = [s for s in services
                          if _selects(exporter["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
    assert exporter_service["metadata"]["name"] == "redis-exporter" and "reactq-redis" in compose_jobs
    assert exporter["endpoints"][0]["relabelings"] == [{"targetLabel": "job", "replacement": "reactq-redis"}]
    assert {"port": 9121, "protocol": "TCP"} in of_kind("NetworkPolicy")[0]["spec"]["ingress"][0]["ports"]
    for component in COMPONENTS:
        spec = monitors[f"reactq-{component}"]["spec"]
        assert "namespaceSelector" not in spec  # its own namespace, reactq
        [service] = [s for s in services if _selects(spec["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
        assert service["metadata"]["name"] == f"{component}-metrics"
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
        assert _selects(service["spec"]["selector"], pods[component]["metadata"]["labels"])
        [endpoint] = spec["endpoints"]
        [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        job = f"reactq-{component}"
        assert job in compose_jobs
        assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": job}]
        assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
        # The operator's Prometheus (another namespace) may reach that port through the overlay's policy.
        [policy] = of_kind("NetworkPolicy")
        [rule] = policy["spec"]["ingress"]
        assert {"port": port["port"], "protocol": "TCP"} in rule["ports"], component
        assert rule["from"] == [{"namespaceSelector": {}, "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
        labels = pods[component]["metadata"]["labels"]
        [name_in, component_in] = policy["spec"]["podSelector"]["matchExpressions"]
        assert labels[name_in["key"]] in name_in["values"] and labels[component_in["key"]] in component_in["values"]


def test_the_prometheus_rule_holds_the_rule_files_groups() -> None:
    [rule] = of_kind("PrometheusRule")
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    assert rule["spec"]["groups"] == groups, "run python3 scripts/prometheus_rule.py after editing a rule file"


def test_the_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    [rule] = of_kind("PrometheusRule")
    path = tmp_path / "operator.rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool_binary(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def promtool_test(tmp_path: Path, alertname: str, series: dict[str, str], eval_time: str,
                  expected: list[dict[str, str]]) -> None:
    """`promtool test rules` on the shipped rule files: at eval_time exactly the `expected` alerts fire (their
    labels; a `value` entry is the alert's value, rendered into its annotations)."""
    alerts = [{"exp_labels": {"alertname": alertname, **{k: v for k, v in labels.items() if k != "value"}},
               "exp_annotations": _annotations(alertname, labels)} for labels in expected]
    tests = {"rule_files": [str(PROMETHEUS_DIR / "recording.rules.yml"), str(PROMETHEUS_DIR / "alerts.rules.yml")],
             "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series.items()],
                        "alert_rule_test": [{"eval_time": eval_time, "alertname": alertname, "exp_alerts": alerts}]}]}
    path = tmp_path / f"{alertname}.test.yml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool_binary(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _annotations(alertname: str, labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations as Prometheus renders them for these labels (and `value`, if given)."""
    [alert] = [r for g in yaml.safe_load((PROMETHEUS_DIR / "alerts.rules.yml").read_text())["groups"]
               for r in g["rules"] if r.get("alert") == alertname]
    rendered = {}
    for key, text in alert["annotations"].items():
        for name, value in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", value)
        rendered[key] = text.replace("{{ $value }}", labels.get("value", "")).strip()
    return rendered


def test_worker_down_matches_the_job_names_of_every_deployment(tmp_path: Path) -> None:
    """The alert fires for the workers' jobs as compose, the k8s base and these ServiceMonitors name them, and
    as the operator names them by default (the Service's name, or `<namespace>/<name>` for a PodMonitor),
    and never for other down targets."""
    worker_jobs = ["reactq-step-worker", "reactq-sandbox-worker", "step-worker-metrics", "reactq/sandbox-worker"]
    other_jobs = ["reactq-api", "reactq-stub", "api-metrics", "kube-apiserver"]
    series = {f'up{{job="{job}", instance="i", namespace="reactq"}}': "0x10" for job in worker_jobs + other_jobs}
    expected = [{"severity": "critical", "job": job, "instance": "i", "namespace": "reactq"} for job in worker_jobs]
    promtool_test(tmp_path, "ReactqWorkerDown", series, "5m", expected)


def test_runs_stuck_in_one_namespace_alert_although_another_moves(tmp_path: Path) -> None:
    """Under the operator every series has `namespace`: an installation whose runs are stuck alerts even when
    another installation scraped by the same Prometheus keeps recording steps."""
    series = {}
    for namespace, steps in (("stuck", "7x40"), ("moving", "0+2x40")):
        labels = f'namespace="{namespace}", job="reactq-step-worker", instance="i"'
        series[f"reactq_runs_in_progress{{{labels}}}"] = "3x40"
        series[f'reactq_steps_total{{{labels}, outcome="tool_calls"}}'] = steps
    promtool_test(tmp_path, "ReactqRunsStuck", series, "30m",
                  [{"severity": "critical", "namespace": "stuck", "value": "3"}])
