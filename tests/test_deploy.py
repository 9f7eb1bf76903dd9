"""The deployment files keep Redis, metrics and dashboards closed: checked offline (compose rendered by
the real docker-compose, deploy/k8s/base by the real kubectl kustomize), and the Redis role users of
deploy/redis/acl.conf proven on a real redis-server running a real run (API, step worker, sandbox worker each
as its user)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_k8s import kustomize
from tests.fixtures_services import start_on_free_port
from tests.waiting import wait_for

COMPOSE = ROOT / "docker-compose.yml"
ROLES = {"api": "REDIS_API_PASSWORD", "step-worker": "REDIS_STEP_WORKER_PASSWORD",
         "sandbox-worker": "REDIS_SANDBOX_WORKER_PASSWORD", "exporter": "REDIS_EXPORTER_PASSWORD",
         "keda": "REDIS_KEDA_PASSWORD"}
SECRETS = {**{var: f"pw-{role}" for role, var in ROLES.items()}, "GRAFANA_ADMIN_PASSWORD": "pw-grafana"}


def compose_config(env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (apt-get install docker-compose; scripts/test.sh does)"
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS and not k.startswith("REACTQ_")}
    return subprocess.run([binary, "-f", str(COMPOSE), "--project-directory", str(ROOT / "deploy"), "config",
                           *options], env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_compose_config_q_accepts_the_file() -> None:
    """`docker-compose config -q`, as a user runs it: the file is valid and renders without a warning."""
    checked = compose_config(SECRETS, "-q")
    assert checked.returncode == 0 and not checked.stdout and not checked.stderr.strip(), checked


def test_compose_refuses_to_start_without_passwords() -> None:
    missing = compose_config({})
    assert missing.returncode != 0 and "scripts/compose-secrets.sh" in missing.stderr


def test_compose_closes_redis_metrics_and_grafana() -> None:
    rendered = compose_config(SECRETS)
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(rendered.stdout)["services"]
    urls = {name: s.get("environment", {}).get("REACTQ_REDIS_URL") for name, s in services.items()}
    assert urls["api"] == "redis://api:pw-api@redis:6379/0"
    assert urls["step-worker"] == "redis://step-worker:pw-step-worker@redis:6379/0"
    assert urls["sandbox-worker"] == "redis://sandbox-worker:pw-sandbox-worker@redis:6379/0"
    assert urls["stub"] is None  # the stub needs no Redis
    redis_service = services["redis"]
    assert redis_service["entrypoint"][1:] == ["/etc/reactq-redis/start.sh", "/etc/reactq-redis/acl.conf"]
    assert {k: redis_service["environment"][k] for k in ROLES.values()} == {v: f"pw-{r}" for r, v in ROLES.items()}
    published = {name: [p if isinstance(p, str) else p.get("host_ip", "") for p in s.get("ports", [])]
                 for name, s in services.items() if s.get("ports")}
    assert set(published) == {"api", "prometheus", "grafana"}, published  # never Redis or a worker
    assert all("127.0.0.1" in str(p) for ports in published.values() for p in ports), published
    assert not any("enable-lifecycle" in arg for arg in services["prometheus"]["command"])
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "pw-grafana"
    wider = compose_config({**SECRETS, "REACTQ_PUBLISH_ADDR": "0.0.0.0"})
    assert "0.0.0.0" in str(yaml.safe_load(wider.stdout)["services"]["api"]["ports"])


def k8s_objects() -> list[dict[str, Any]]:
    """Every object `kubectl kustomize deploy/k8s/base` renders."""
    return list(kustomize("base"))


def _pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects
            if o["kind"] in ("Deployment", "StatefulSet")}


def _allowed_from(objects: list[dict[str, Any]], component: str, port: int) -> set[str]:
    """Components whose pods a NetworkPolicy lets reach `component` on `port` ('*' = anyone)."""
    allowed: set[str] = set()
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        if not _selects(policy["spec"]["podSelector"], component):
            continue
        for rule in policy["spec"].get("ingress", []):
            if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
                continue
            if not rule.get("from"):
                allowed.add("*")
            for peer in rule.get("from", []):
                allowed |= {c for c in ("api", "step-worker", "sandbox-worker", "stub", "redis", "prometheus",
                                        "grafana", "redis-exporter") if _selects(peer["podSelector"], c)}
    return allowed


def _selects(selector: dict[str, Any], component: str) -> bool:
    labels = {"app.kubernetes.io/name": "reactq", "app.kubernetes.io/component": component}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def test_kubernetes_closes_redis_metrics_and_grafana() -> None:
    objects = k8s_objects()
    pods = _pod_specs(objects)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"] for p in policies), "no default deny"
    assert _allowed_from(objects, "redis", 6379) == {"api", "step-worker", "sandbox-worker", "redis-exporter"}
    for worker in ("step-worker", "sandbox-worker"):
        assert _allowed_from(objects, worker, 9808) == {"prometheus"}
    assert _allowed_from(objects, "prometheus", 9090) == {"grafana"}
    assert _allowed_from(objects, "api", 8000) == {"*"}

    for role in ("api", "step-worker", "sandbox-worker"):
        [container] = [c for c in pods[role]["containers"] if c["name"] in ("api", "worker")]
        env = {e["name"]: e for e in container["env"]}
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "reactq-redis", "key": role}
        assert env["REACTQ_REDIS_URL"]["value"] == f"redis://{role}:$(REDIS_PASSWORD)@redis:6379/0"
        assert list(env).index("REDIS_PASSWORD") < list(env).index("REACTQ_REDIS_URL")  # $(...) expands
    config = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "reactq-env")
    assert "REACTQ_REDIS_URL" not in config["data"]
    [redis_container] = pods["redis"]["containers"]
    assert redis_container["command"][:3] == ["sh", "/etc/reactq-redis/start.sh", "/etc/reactq-redis/acl.conf"]
    assert {e["name"] for e in redis_container["env"]} == set(ROLES.values())
    [prometheus] = pods["prometheus"]["containers"]
    assert not any("enable-lifecycle" in a for a in prometheus["args"])
    [grafana] = pods["grafana"]["containers"]
    password = next(e for e in grafana["env"] if e["name"] == "GF_SECURITY_ADMIN_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "grafana-admin", "key": "password"}  # not optional
    assert not [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] in ("reactq-redis",
                                                                                          "grafana-admin")]


@pytest.fixture
def acl_redis(tmp_path: Path) -> Any:
    """redis-server started by deploy/redis/start.sh with deploy/redis/acl.conf, role passwords set."""
    env = {**os.environ, **SECRETS}
    here = ROOT / "deploy" / "redis"
    port, proc = start_on_free_port(lambda port: subprocess.Popen(
        ["sh", str(here / "start.sh"), str(here / "acl.conf"), "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(tmp_path), "--save", ""], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    yield {role: f"redis://{role}:pw-{role}@127.0.0.1:{port}/0" for role in ROLES} | {"port": str(port)}
    proc.terminate()
    proc.wait(10)


@pytest.mark.integration
def test_each_role_works_with_its_own_redis_user(cluster_env: dict[str, str], tmp_path: Path, acl_redis: Any) -> None:
    """A sandboxed run goes through with the API, the step worker and the sandbox worker each on its own
    Redis user; the sandbox worker's user cannot read a run, the exporter's no data, nobody without one."""
    c = Cluster({**cluster_env, "REACTQ_REDIS_URL": acl_redis["api"]}, tmp_path)
    try:
        key = make_key(c, "acl-tenant", "standard", via_cli=True)  # the CLI, with its role's Redis user
        c.start_worker(queues="steps", concurrency=4, REACTQ_REDIS_URL=acl_redis["step-worker"])
        c.start_worker(queues="sandbox", concurrency=2, REACTQ_REDIS_URL=acl_redis["sandbox-worker"])
        api = start_api(c)
        try:
            client = api.client(key)
            question = "What is the sum of the first 10 primes?"
            run_id = client.post("/v1/runs", json={"question": question}).json()["run_id"]
            run = wait_for(f"run {run_id} to finish",
                           lambda: client.get(f"/v1/runs/{run_id}", params={"trace": True}).json(), 90, 0.3,
                           until=lambda polled: polled["status"] not in ("queued", "running"))
            assert run["status"] == "succeeded" and run["answer"] == "129", run
            assert run["trace"][0]["tool_calls"][0]["name"] == "python"
        finally:
            api.stop()
        sandbox_user = redis.Redis.from_url(acl_redis["sandbox-worker"])
        with pytest.raises(redis.exceptions.NoPermissionError):
            sandbox_user.get(f"reactq:run:{run_id}")
        with pytest.raises(redis.exceptions.NoPermissionError):
            sandbox_user.hgetall("reactq:tenant:acl-tenant")
        exporter = redis.Redis.from_url(acl_redis["exporter"])
        assert exporter.info("server")["redis_version"]
        with pytest.raises(redis.exceptions.NoPermissionError):
            exporter.get(f"reactq:run:{run_id}")
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis.from_url(acl_redis["api"]).flushall()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=int(acl_redis["port"])).get("x")
    finally:
        c.stop()
