"""The KEDA overlay (deploy/k8s/autoscale-keda), as the real kustomize renders it:

- every KEDA object is valid against KEDA's own CRDs (v2.20.2, vendored under tests/schemas/);
- each ScaledObject scales on its queue's depth as the API's metrics port reports it (KEDA's metrics-api
  scaler, format prometheus): the sum of every Redis list its messages wait in, checked on a real
  `reactq api` with messages in the lists;
- KEDA never connects to Redis (its redis scaler runs an EVAL script every poll, and no Redis user but the
  app's may run one: tests/test_redis_acl.py)."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_crds import crd_errors, crd_schemas
from tests.fixtures_k8s import kustomize
from tests.fixtures_services import free_port, wait_for_port
from worker.names import SANDBOX_QUEUE, STEPS_QUEUE, queue_lists

KEDA_OBJECTS = [d for d in kustomize("autoscale-keda") if d["apiVersion"].startswith("keda.sh/")]
SCALED = {d["metadata"]["name"]: d for d in KEDA_OBJECTS if d["kind"] == "ScaledObject"}
QUEUE_OF = {"step-worker": STEPS_QUEUE, "sandbox-worker": SANDBOX_QUEUE}


def _id(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


# --- KEDA's CRD schemas --------------------------------------------------------------------------------

def test_the_vendored_crds_name_their_keda_version() -> None:
    files = sorted((ROOT / "tests" / "schemas").glob("keda-*/keda.sh_*.yaml"))
    assert {f.name for f in files} >= {"keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml"}
    for f in files:
        version = f.parent.name.removeprefix("keda-")
        assert re.fullmatch(r"2\.\d+\.\d+", version) and f"kedacore/keda v{version} " in f.read_text()


@pytest.mark.parametrize("doc", KEDA_OBJECTS, ids=_id)
def test_keda_object_is_valid_against_kedas_crd(doc: dict[str, Any]) -> None:
    assert (doc["apiVersion"], doc["kind"]) in crd_schemas()
    assert crd_errors(doc) == []


@pytest.mark.parametrize(("path", "value", "why"), [
    (("spec", "advanced", "scalingModifier"), {"formula": "p0"}, "Additional properties"),  # a typo
    (("spec", "triggers", 0, "valueLocation"), "x", "Additional properties"),  # beside, not in, metadata
    (("spec", "minReplicaCount"), 40, "minReplicaCount must be less than or equal to maxReplicaCount"),  # CEL
    (("spec", "triggers", 0, "metadata", "targetValue"), 400, "is not of type 'string'"),
])
def test_the_crd_check_refuses_what_the_api_server_would(path: tuple[Any, ...], value: Any, why: str) -> None:
    broken = copy.deepcopy(SCALED["step-worker"])
    *parents, last = path
    node = broken
    for key in parents:
        node = node[key]
    node[last] = value
    errors = crd_errors(broken)
    assert any(why in e for e in errors), errors


# --- scaling on the queue depth the API reports ------------------------------------------------------------

def selector(value_location: str) -> tuple[str, dict[str, str]]:
    """A metrics-api `valueLocation` in format prometheus: a metric selector, the name and equality label
    matchers (KEDA parses it with Prometheus's ParseMetricSelector and takes the sample all matchers fit)."""
    found = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}', value_location)
    assert found, value_location
    labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', found.group(2)))
    assert found.group(2) == ",".join(f'{k}="{v}"' for k, v in labels.items()), value_location
    return found.group(1), labels


def api_metrics_service() -> tuple[str, int]:
    """The API's metrics port as the base renders it: `<service>.<namespace>.svc`, and the port."""
    [svc] = [d for d in kustomize("base") if d["kind"] == "Service" and d["metadata"]["name"] == "api-metrics"]
    [port] = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "metrics"]
    return f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc", port


@pytest.mark.parametrize("name", sorted(QUEUE_OF))
def test_each_worker_scales_on_its_queues_depth_read_from_the_api(name: str) -> None:
    spec = SCALED[name]["spec"]
    [trigger] = spec["triggers"]
    host, port = api_metrics_service()
    assert (trigger["type"], trigger["metricType"]) == ("metrics-api", "AverageValue")  # target per pod
    meta = trigger["metadata"]
    assert meta["url"] == f"http://{host}:{port}/metrics" and meta["format"] == "prometheus"
    assert selector(meta["valueLocation"]) == ("reactq_queue_depth", {"queue": QUEUE_OF[name]})
    assert float(meta["targetValue"]) > 0
    assert "authenticationRef" not in trigger and "scalingModifiers" not in spec.get("advanced", {})


def test_keda_never_connects_to_redis() -> None:
    """No redis trigger (its scaler runs an EVAL script each poll), no Redis credentials, no way in."""
    overlay = kustomize("autoscale-keda")
    assert {t["type"] for d in SCALED.values() for t in d["spec"]["triggers"]} == {"metrics-api"}
    assert not [d for d in KEDA_OBJECTS if d["kind"] == "TriggerAuthentication"]
    [policy] = [d for d in overlay if d["kind"] == "NetworkPolicy" and d not in kustomize("base")]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "api"
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [api_metrics_service()[1]]


def test_the_issues_backlog_now_scales_out() -> None:
    """8 priority lists with 399 waiting each: scaling on the largest list gave 1 pod; the depth (their sum,
    checked on a real API below) gives 8."""
    spec = SCALED["step-worker"]["spec"]
    depth = 8 * 399
    pods = min(spec["maxReplicaCount"], math.ceil(depth / float(spec["triggers"][0]["metadata"]["targetValue"])))
    assert pods == 8


@pytest.mark.integration
def test_the_value_location_reads_the_sum_of_the_queues_lists_from_a_real_api(cluster: Cluster) -> None:
    """What KEDA fetches: the API's /metrics with messages waiting in every priority list of both queues;
    each trigger's selector matches exactly one sample, whose value is the sum of its queue's lists."""
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    waiting = {}
    for queue in (STEPS_QUEUE, SANDBOX_QUEUE):
        for n, name in enumerate(queue_lists(queue)):
            if n % 3:  # some lists stay empty
                client.rpush(name, *[b"message"] * (n + len(queue)))
        waiting[queue] = sum(n + len(queue) for n in range(len(queue_lists(queue))) if n % 3)
    make_key(cluster, "default")  # the API starts only with a tenant to serve
    port = free_port()
    cluster.env["REACTQ_API_METRICS_PORT"] = str(port)  # a port of its own, as the k8s base sets it (9807)
    api = start_api(cluster)
    try:
        wait_for_port(port, owner=api.proc)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        assert api.client(None).get("/metrics").status_code == 404  # not on the API's own port
    finally:
        api.stop()
        client.close()
    for name, scaled in SCALED.items():
        metric, labels = selector(scaled["spec"]["triggers"][0]["metadata"]["valueLocation"])
        values = [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                  if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items())]
        assert values == [waiting[QUEUE_OF[name]]], name
