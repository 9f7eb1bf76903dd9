"""deploy/k8s, built by the real kustomize (`kubectl kustomize`, no flags) for the base and each overlay: every
rendered object against the Kubernetes API schemas (kubernetes-validate), every namespaced one in namespace
reactq, and the autoscaling overlays against what they scale (KEDA's CRDs have no schema in that package, so
their references are checked here: targets exist, queue names are the ones the workers consume)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.fixtures_k8s import BUILDS, NAMESPACE, kustomize
from worker.tasks.app import SANDBOX_QUEUE, STEPS_QUEUE, app

K8S_VERSION = "1.30.0"
# Kinds these builds render that are not namespaced (everything else must land in namespace reactq).
CLUSTER_SCOPED = {"Namespace"}

CORE = list(kustomize("base"))
KEDA = [d for d in kustomize("autoscale-keda") if d not in CORE]  # what the overlay adds or changes
HPA = [d for d in kustomize("autoscale-hpa") if d not in CORE]


def _id(build: str, doc: dict[str, Any]) -> str:
    return f"{build}:{doc['kind']}/{doc['metadata']['name']}"


RENDERED = [(b, d) for b in BUILDS for d in kustomize(b)]


@pytest.mark.parametrize(("build", "doc"), [pytest.param(b, d, id=_id(b, d)) for b, d in RENDERED
                                            if not d["apiVersion"].startswith("keda.sh/")])
def test_rendered_object_is_valid_against_the_kubernetes_schema(build: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("build", BUILDS)
def test_every_namespaced_object_of_a_build_is_in_namespace_reactq(build: str) -> None:
    objects = kustomize(build)
    outside = [_id(build, d) for d in objects
               if d["kind"] not in CLUSTER_SCOPED and d["metadata"].get("namespace") != NAMESPACE]
    assert not outside
    assert [d["metadata"]["name"] for d in objects if d["kind"] == "Namespace"] == [NAMESPACE]
    assert all("namespace" not in d["metadata"] for d in objects if d["kind"] in CLUSTER_SCOPED)


def test_overlays_add_their_autoscalers_to_the_whole_base() -> None:
    for build, kinds in (("autoscale-keda", {"ScaledObject", "NetworkPolicy"}),
                         ("autoscale-hpa", {"HorizontalPodAutoscaler"})):
        objects = kustomize(build)
        assert all(d in objects for d in CORE), build  # the base, unchanged
        assert {d["kind"] for d in objects if d not in CORE} == kinds, build


def deployments() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in CORE if d["kind"] == "Deployment"}


def test_keda_scales_each_worker_on_the_queue_it_consumes() -> None:
    objects = {d["metadata"]["name"]: d for d in KEDA if d["kind"] == "ScaledObject"}
    assert set(objects) == {"step-worker", "sandbox-worker"}
    expected_queue = {"step-worker": STEPS_QUEUE, "sandbox-worker": SANDBOX_QUEUE}
    for name, obj in objects.items():
        target = deployments()[obj["spec"]["scaleTargetRef"]["name"]]
        args = target["spec"]["template"]["spec"]["containers"][0]["args"]
        consumed = {"steps": STEPS_QUEUE, "sandbox": SANDBOX_QUEUE}[args[args.index("--queues") + 1]]
        assert consumed == expected_queue[name]
        [trigger] = obj["spec"]["triggers"]  # the queue's depth from the API (tests/test_keda.py)
        assert f'queue="{consumed}"' in trigger["metadata"]["valueLocation"]
        assert float(trigger["metadata"]["targetValue"]) >= 1
        assert 1 <= obj["spec"]["minReplicaCount"] < obj["spec"]["maxReplicaCount"]
    # The queue depth is waiting work only because a worker takes one message per thread at a time.
    assert app.conf.worker_prefetch_multiplier == 1


def test_keda_reads_the_api_metrics_port_it_may_reach() -> None:
    """KEDA's operator reaches the API's metrics port (what the base's API serves /metrics on, and only
    Prometheus may reach otherwise), and nothing else: not Redis."""
    [config] = [d["data"] for d in CORE if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("reactq-")
                and "REACTQ_API_METRICS_PORT" in d.get("data", {})]
    [policy] = [d for d in KEDA if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "api"
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [
        int(config["REACTQ_API_METRICS_PORT"])]
    [source] = policy["spec"]["ingress"][0]["from"]
    assert source["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "keda"}
    assert source["podSelector"]["matchLabels"] == {"app": "keda-operator"}


def test_hpa_targets_deployments_that_request_cpu() -> None:
    hpas = [d for d in HPA if d["kind"] == "HorizontalPodAutoscaler"]
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas} == {"step-worker", "sandbox-worker"}
    for hpa in hpas:
        target = deployments()[hpa["spec"]["scaleTargetRef"]["name"]]
        spec = target["spec"]["template"]["spec"]
        sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
        for container in spec["containers"] + sidecars:  # what the pod's CPU utilisation is measured against
            assert "cpu" in container.get("resources", {}).get("requests", {}), container["name"]


def test_workers_get_time_to_drain_before_they_are_killed() -> None:
    for name in ("step-worker", "sandbox-worker"):
        spec = deployments()[name]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for c in spec["containers"] for e in c.get("env", [])}
        drain = float(env.get("REACTQ_DRAIN_TIMEOUT_S") or 60)
        assert spec["terminationGracePeriodSeconds"] > drain, name
