"""Exposure (docs/decisions/exposure.md): what each process and pod lets others see and reach.

- A real `reactq api` serves /metrics (tenants, spend) only on REACTQ_API_METRICS_PORT, bound to
  REACTQ_METRICS_HOST; its client port answers 404 there. It starts and takes runs with no LLM key.
  /healthz fails while Redis is unreachable, /livez does not.
- A real worker's metrics listener binds 127.0.0.1 unless REACTQ_METRICS_HOST says otherwise.
- deploy/redis/start.sh runs redis-server as an unprivileged user (setpriv), as the manifests now make it.
- The manifests (`kubectl kustomize`) and the compose file (`docker-compose config`): the API's metrics port
  only for Prometheus, no LLM key for the API and no placeholder Secret, sandbox-worker egress to Redis and
  DNS (never the metadata service or the kube-apiserver), Redis as a non-root user.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import ROOT, Cluster, metrics_port
from tests.fixtures_k8s import kustomize
from tests.fixtures_services import RedisServer, free_port, wait_for_port
from tests.test_deploy import ROLES, SECRETS, _allowed_from, _selects, compose_config
from tests.waiting import wait_for
from worker.cli.serve import api_metrics_port

REDIS_UID = 999  # the redis user of the redis:7-bookworm image


def listening_on(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) with a listening socket on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                found.append(local.rsplit(":", 1)[0])
    return found


def test_the_api_metrics_port_by_setting_and_listening_address() -> None:
    # Unset: on the API's port while it listens on loopback alone (docs/DESIGN.md's GET /metrics), else apart.
    assert api_metrics_port(None, "127.0.0.1") == 0 and api_metrics_port(None, "::1") == 0
    assert api_metrics_port(None, "localhost") == 0
    assert api_metrics_port(None, "0.0.0.0") == 9807 and api_metrics_port(None, "10.1.2.3") == 9807
    assert api_metrics_port(None, "api.example") == 9807
    assert api_metrics_port(0, "0.0.0.0") == 0 and api_metrics_port(9100, "127.0.0.1") == 9100


@pytest.mark.integration
def test_the_api_serves_metrics_only_on_its_metrics_port_and_needs_no_llm_key(cluster: Cluster) -> None:
    port = free_port()
    cluster.env["REACTQ_API_METRICS_PORT"] = str(port)
    cluster.env.pop("REACTQ_LLM_API_KEY", None)
    assert not any("LLM_API_KEY" in k for k in cluster.env)
    key = make_key(cluster, "default")
    api = start_api(cluster)
    try:
        wait_for_port(port, owner=api.proc)
        public = api.client(None)
        hidden = public.get("/metrics")
        assert hidden.status_code == 404, hidden.text
        assert "/metrics" not in public.get("/openapi.json").json()["paths"]
        assert public.get("/livez").text == "ok"
        assert public.get("/healthz").json() == {"status": "ok"}
        page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert page.status_code == 200
        assert "reactq_queue_depth{" in page.text and "reactq_runs_in_progress " in page.text
        assert listening_on(port) == ["0100007F"]  # 127.0.0.1, REACTQ_METRICS_HOST's default

        cluster.start_worker(queues="steps", concurrency=2, REACTQ_LLM_API_KEY="reactq-stub")
        run_id = api.client(key).post("/v1/runs", json={"question": "What is 6 * 7?"}).json()["run_id"]
        assert cluster.wait_for_run(run_id)["status"] == "succeeded"
    finally:
        api.stop()


@pytest.mark.integration
def test_api_readiness_fails_while_redis_is_down_and_liveness_does_not(own_redis: RedisServer,
                                                                       cluster: Cluster) -> None:
    cluster.env["REACTQ_REDIS_URL"] = own_redis.url
    make_key(cluster, "default")
    api = start_api(cluster)
    try:
        client = api.client(None)
        assert client.get("/healthz").status_code == 200
        own_redis.stop()
        down = wait_for("/healthz to fail", lambda: client.get("/healthz"), 60, until=lambda r: r.status_code == 503)
        assert down.json()["error"]["message"] == "Redis is unreachable"
        assert client.get("/livez").status_code == 200
    finally:
        api.stop()


@pytest.mark.integration
@pytest.mark.parametrize(("host", "bound"), [(None, ["0100007F"]), ("0.0.0.0", ["00000000"])])
def test_worker_metrics_bind_the_metrics_host(cluster: Cluster, host: str | None, bound: list[str]) -> None:
    port = metrics_port()
    extra = {"REACTQ_METRICS_HOST": host} if host else {}
    cluster.start_worker(queues="steps", concurrency=2, metrics_port=port, **extra)
    assert listening_on(port) == bound
    assert "reactq_steps_total" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")  # CI runs as root
def test_redis_start_script_runs_as_an_unprivileged_user() -> None:
    """What the pod's securityContext (runAsUser 999) and compose's `user: redis` make of start.sh."""
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is not installed"
    top = Path(tempfile.mkdtemp(prefix="reactq-redis-uid-"))  # pytest's tmp_path is root's alone
    top.chmod(0o755)
    data = top / "data"
    data.mkdir()
    os.chown(data, REDIS_UID, REDIS_UID)
    here = ROOT / "deploy" / "redis"
    port = free_port()
    env = {**os.environ, **SECRETS, "TMPDIR": str(data)}
    proc = subprocess.Popen(
        [setpriv, f"--reuid={REDIS_UID}", f"--regid={REDIS_UID}", "--clear-groups", "sh", str(here / "start.sh"),
         str(here / "acl.conf"), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
         "--appendonly", "yes"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, owner=proc)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        assert uids == [str(REDIS_UID)] * 4
        client = redis.Redis.from_url(f"redis://api:pw-api@127.0.0.1:{port}/0")
        client.set("reactq:probe", "1")
        assert client.get("reactq:probe") == b"1"
        assert any(p.stat().st_uid == REDIS_UID for p in data.rglob("*.aof*"))  # it writes its AOF as that user
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(top)


# --- the manifests and the compose file ---------------------------------------------------------------

BASE = list(kustomize("base"))


def _pod(name: str) -> dict[str, Any]:
    return next(o["spec"]["template"]["spec"] for o in BASE
                if o["kind"] in ("Deployment", "StatefulSet") and o["metadata"]["name"] == name)


def test_only_prometheus_reaches_the_api_metrics_port() -> None:
    assert _allowed_from(BASE, "api", 9807) == {"prometheus"}
    assert _allowed_from(BASE, "api", 8000) == {"*"}
    service = next(o for o in BASE if o["kind"] == "Service" and o["metadata"]["name"] == "api-metrics")
    assert [p["port"] for p in service["spec"]["ports"]] == [9807]
    config = next(o for o in BASE if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("prometheus-config"))
    k8s_jobs = {j["job_name"]: j for j in yaml.safe_load(config["data"]["prometheus.yml"])["scrape_configs"]}
    assert [sd["port"] for sd in k8s_jobs["reactq-api"]["dns_sd_configs"]] == [9807]
    compose_prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    compose_jobs = {j["job_name"]: j for j in compose_prometheus["scrape_configs"]}
    assert compose_jobs["reactq-api"]["static_configs"] == [{"targets": ["api:9807"]}]
    services = yaml.safe_load(compose_config(SECRETS).stdout)["services"]
    [published] = services["api"]["ports"]
    assert str(published) == "127.0.0.1:8000:8000/tcp"  # 9807 is not published
    assert services["api"]["environment"]["REACTQ_API_METRICS_PORT"] == "9807"


def test_the_api_gets_no_llm_key_and_no_placeholder_key_is_shipped() -> None:
    assert not [o for o in BASE if o["kind"] == "Secret"]  # every secret is created by hand, once
    def secrets_of(name: str) -> set[str]:
        return {e["secretRef"]["name"] for c in _pod(name)["containers"] for e in c.get("envFrom", [])
                if "secretRef" in e}
    assert secrets_of("api") == set() and secrets_of("sandbox-worker") == set()
    assert secrets_of("step-worker") == {"reactq-llm"}
    assert "reactq-llm" in (ROOT / "deploy" / "k8s" / "base" / "kustomization.yaml").read_text()  # documented
    services = yaml.safe_load(compose_config(SECRETS).stdout)["services"]
    assert "REACTQ_LLM_API_KEY" not in services["api"]["environment"]
    assert "REACTQ_LLM_API_KEY" in services["step-worker"]["environment"]


def _egress_allows(ip: str, port: int, protocol: str = "TCP") -> bool:
    """Whether a NetworkPolicy selecting the sandbox-worker pods lets them reach `ip` (an address no pod
    selector matches: a node, the metadata service, an API server) on `port`."""
    address = ipaddress.ip_address(ip)
    for policy in (o for o in BASE if o["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        if not _selects(spec["podSelector"], "sandbox-worker") or "Egress" not in spec["policyTypes"]:
            continue
        for rule in spec.get("egress", []):
            ports = rule.get("ports")
            if ports and not any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports):
                continue
            if not rule.get("to"):
                return True
            for peer in rule["to"]:
                block = peer.get("ipBlock")
                if block and address in ipaddress.ip_network(block["cidr"]) and not any(
                        address in ipaddress.ip_network(e) for e in block.get("except", [])):
                    return True
    return False


def test_sandbox_worker_egress_reaches_redis_and_dns_and_never_the_cluster_or_the_cloud() -> None:
    policies = [o for o in BASE if o["kind"] == "NetworkPolicy" and "Egress" in o["spec"]["policyTypes"]
                and _selects(o["spec"]["podSelector"], "sandbox-worker")]
    assert policies, "sandbox-worker pods have unrestricted egress"
    peers = [(peer, rule.get("ports", [])) for p in policies for rule in p["spec"]["egress"] for peer in rule["to"]]
    to_redis = [ports for peer, ports in peers if "podSelector" in peer and "namespaceSelector" not in peer
                and _selects(peer["podSelector"], "redis")]
    assert to_redis == [[{"port": 6379, "protocol": "TCP"}]]
    dns = {"k8s-app": "kube-dns"}
    to_dns = [ports for peer, ports in peers if peer.get("podSelector", {}).get("matchLabels") == dns]
    assert to_dns and {(p["port"], p["protocol"]) for p in to_dns[0]} == {(53, "UDP"), (53, "TCP")}
    for ip, port in [("169.254.169.254", 80), ("169.254.169.254", 443), ("10.96.0.1", 443), ("10.0.0.12", 6443),
                     ("172.20.0.1", 443), ("192.168.1.10", 10250), ("100.64.0.1", 443), ("8.8.8.8", 6443)]:
        assert not _egress_allows(ip, port), (ip, port)
    assert _egress_allows("151.101.2.132", 443)  # the image build's registry and Debian mirrors
    for other in ("api", "step-worker", "stub"):  # the other roles are unchanged
        assert not [o for o in BASE if o["kind"] == "NetworkPolicy" and "Egress" in o["spec"]["policyTypes"]
                    and _selects(o["spec"]["podSelector"], other)]


def test_redis_runs_as_its_own_user() -> None:
    pod = _pod("redis")
    assert pod["securityContext"] == {"runAsUser": REDIS_UID, "runAsGroup": REDIS_UID, "fsGroup": REDIS_UID,
                                      "runAsNonRoot": True}
    [container] = pod["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    services = yaml.safe_load(compose_config(SECRETS).stdout)["services"]
    assert services["redis"]["user"] == "redis"
    assert {k: services["redis"]["environment"][k] for k in ROLES.values()} == {v: SECRETS[v] for v in ROLES.values()}


def test_every_pod_binds_its_metrics_listener_for_the_pod_network() -> None:
    config = next(o for o in BASE if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "reactq-env")
    assert config["data"]["REACTQ_METRICS_HOST"] == "0.0.0.0"
    for name in ("api", "step-worker", "sandbox-worker"):
        [container] = [c for c in _pod(name)["containers"] if c["name"] in ("api", "worker")]
        assert {"configMapRef": {"name": "reactq-env"}} in container["envFrom"], name
    services = yaml.safe_load(compose_config(SECRETS).stdout)["services"]
    for name in ("api", "step-worker", "sandbox-worker"):
        assert services[name]["environment"]["REACTQ_METRICS_HOST"] == "0.0.0.0", name
    assert services["api"]["expose"] == ["9807"]
