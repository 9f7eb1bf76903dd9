"""deploy/k8s, checked offline: every core manifest against the Kubernetes API schemas (kubernetes-validate),
and the autoscaling overlays against what they scale (KEDA's CRDs have no schema in that package, so their
references are checked here: targets exist, queue names are the ones the workers consume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.fixtures_cluster import ROOT
from worker.names import queue_lists
from worker.tasks.app import SANDBOX_QUEUE, STEPS_QUEUE, app

K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.30.0"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every resource of a directory's kustomization (not kustomize's own files, not config data)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    found = []
    for name in kustomization["resources"]:
        path = directory / name
        if path.is_file():
            found += [(path, d) for d in documents(path)]
    return found


CORE = manifests(K8S)
KEDA = manifests(K8S / "autoscale-keda")
HPA = manifests(K8S / "autoscale-hpa")


KEDA_CORE_KINDS = [(p, d) for p, d in KEDA if not d["apiVersion"].startswith("keda.sh/")]


@pytest.mark.parametrize(("path", "doc"), [pytest.param(p, d, id=f"{p.name}:{d['kind']}/{d['metadata']['name']}")
                                           for p, d in CORE + HPA + KEDA_CORE_KINDS])
def test_core_manifest_is_valid_against_the_kubernetes_schema(path: Path, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def deployments() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in CORE if d["kind"] == "Deployment"}


def test_keda_scales_each_worker_on_the_queue_it_consumes() -> None:
    objects = {d["metadata"]["name"]: d for _, d in KEDA if d["kind"] == "ScaledObject"}
    auths = {d["metadata"]["name"] for _, d in KEDA if d["kind"] == "TriggerAuthentication"}
    assert set(objects) == {"step-worker", "sandbox-worker"}
    expected_queue = {"step-worker": STEPS_QUEUE, "sandbox-worker": SANDBOX_QUEUE}
    for name, obj in objects.items():
        target = deployments()[obj["spec"]["scaleTargetRef"]["name"]]
        args = target["spec"]["template"]["spec"]["containers"][0]["args"]
        consumed = {"steps": STEPS_QUEUE, "sandbox": SANDBOX_QUEUE}[args[args.index("--queues") + 1]]
        assert consumed == expected_queue[name]
        triggers = obj["spec"]["triggers"]
        assert all(t["type"] == "redis" and t["authenticationRef"]["name"] in auths for t in triggers)
        assert all(int(t["metadata"]["listLength"]) >= 1 for t in triggers)
        # Every Redis list the queue's messages can wait in (one per priority for the steps queue).
        wanted = queue_lists(consumed) if consumed == STEPS_QUEUE else [consumed]
        assert [t["metadata"]["listName"] for t in triggers] == wanted
        assert 1 <= obj["spec"]["minReplicaCount"] < obj["spec"]["maxReplicaCount"]
    # The list length is waiting work only because a worker takes one message per thread at a time.
    assert app.conf.worker_prefetch_multiplier == 1


def test_keda_reads_redis_as_a_role_user_it_may_reach() -> None:
    """Redis has no default user (deploy/redis/acl.conf): KEDA logs in as a role that may read the broker's
    lists, with that role's password from Secret reactq-redis, and a NetworkPolicy lets its operator in."""
    acl = (ROOT / "deploy" / "redis" / "acl.conf").read_text()
    [auth] = [d for _, d in KEDA if d["kind"] == "TriggerAuthentication"]
    [ref] = auth["spec"]["secretTargetRef"]
    assert (ref["parameter"], ref["name"]) == ("password", "reactq-redis")
    role = ref["key"]
    assert f"user {role} on " in acl and "~reactq.*" in next(line for line in acl.splitlines()
                                                             if line.startswith(f"user {role} "))
    triggers = [t for _, d in KEDA if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]
    assert {t["metadata"].get("username") for t in triggers} == {role}
    [policy] = [d for _, d in KEDA if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [6379]


def test_hpa_targets_deployments_that_request_cpu() -> None:
    hpas = [d for _, d in HPA if d["kind"] == "HorizontalPodAutoscaler"]
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
