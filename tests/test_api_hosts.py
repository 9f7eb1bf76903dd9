"""The names the API answers to (REACTQ_API_ALLOWED_HOSTS, docs/decisions/exposure.md): a real `reactq api`
answers a request naming another host (a page whose name was re-pointed at 127.0.0.1: DNS rebinding) with
400 everywhere, /metrics and the UI included, with or without --insecure-no-auth; the loopback names, with
any port, and the names a deployment sets are served. The compose file and the manifests set the names
their clients and probes use. The API's separate metrics listener answers the same names and IP addresses
(Prometheus scrapes pods by IP)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import Cluster
from tests.fixtures_k8s import kustomize
from tests.fixtures_services import free_port, wait_for_port
from tests.test_deploy import SECRETS, compose_config
from worker.config import Settings
from worker.runtime.host_names import AllowedHosts, host_name

FOREIGN = "rebound.attacker.example"


def test_host_names_and_the_allowed_list() -> None:
    assert host_name("LocalHost:8000") == "localhost" and host_name("[::1]:8000") == "[::1]"
    assert host_name("127.0.0.1") == "127.0.0.1" and host_name("localhost.:80") == "localhost"
    assert host_name("a b") is None and host_name("localhost:x") is None and host_name("[::1") is None
    loopback = AllowedHosts(Settings().api_allowed_hosts)
    assert all(loopback.allows(h) for h in ("localhost", "localhost:8000", "127.0.0.1:1", "[::1]:8000", "[::1]"))
    assert not any(loopback.allows(h) for h in (FOREIGN, "localhost.attacker.example", "127.0.0.2", "", None,
                                               "[::2]:8000", "127.0.0.1:8000 x"))
    wild = AllowedHosts(["*.corp.example", "api"])
    assert wild.allows("x.corp.example:443") and wild.allows("API") and not wild.allows("corp.example.evil")
    assert AllowedHosts(["*"]).allows(FOREIGN) and not AllowedHosts(["*"]).allows("a/b")
    pods = AllowedHosts(["api"], addresses=True)  # the API's metrics listener: Prometheus scrapes pod IPs
    assert pods.allows("10.1.2.3:9807") and pods.allows("[fd00::1]:9807") and not loopback.allows("10.1.2.3")
    assert not pods.allows(f"{FOREIGN}:9807") and not pods.allows("10.1.2.3.attacker.example")


def _get(client: httpx.Client, path: str, host: str) -> httpx.Response:
    return client.get(path, headers={"Host": host})


@pytest.mark.integration
def test_insecure_no_auth_answers_only_its_loopback_names(cluster: Cluster) -> None:
    api = start_api(cluster, "--insecure-no-auth")
    port = api.url.rsplit(":", 1)[1]
    try:
        client = api.client(None)
        created = client.post("/v1/runs", json={"question": "2+2?"}, headers={"Host": f"{FOREIGN}:{port}"})
        assert created.status_code == 400, created.text
        assert "REACTQ_API_ALLOWED_HOSTS" in created.json()["error"]["message"]
        for path in ("/v1/runs", "/metrics", "/ui", "/ui/runs", "/healthz", "/livez", "/openapi.json"):
            refused = _get(client, path, f"{FOREIGN}:{port}")
            assert refused.status_code == 400, (path, refused.text)
            assert "csrf" not in refused.text.lower() and "reactq_" not in refused.text
        assert _get(client, "/v1/runs", FOREIGN).status_code == 400  # no port: the same
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
            assert _get(client, "/v1/runs", host).json()["runs"] == []  # the refused POST made no run
        assert _get(client, "/metrics", f"localhost:{port}").status_code == 200
    finally:
        api.stop()


@pytest.mark.integration
def test_insecure_no_auth_refuses_to_answer_any_host(cluster: Cluster) -> None:
    refused = cluster.reactq("api", "--insecure-no-auth", "--port", "1", timeout=60,
                             REACTQ_API_ALLOWED_HOSTS='["localhost", "*"]')
    assert refused.returncode == 2 and "REACTQ_API_ALLOWED_HOSTS" in refused.stdout + refused.stderr


@pytest.mark.integration
def test_authenticated_api_refuses_foreign_hosts_and_serves_the_set_names(cluster: Cluster) -> None:
    key = make_key(cluster, "default")
    cluster.env["REACTQ_API_ALLOWED_HOSTS"] = '["api.corp.example", "*.reactq.example"]'
    api = start_api(cluster)  # on loopback: /metrics on the API's own port
    try:
        client = api.client(key)
        assert _get(client, "/metrics", FOREIGN).status_code == 400
        assert _get(client, "/v1/usage", FOREIGN).status_code == 400
        assert _get(client, "/metrics", "localhost").status_code == 400  # the setting replaces the default
        assert _get(client, "/metrics", "api.corp.example:8443").status_code == 200
        assert _get(client, "/v1/usage", "eu.reactq.example").status_code == 200
    finally:
        api.stop()


@pytest.mark.integration
def test_the_api_metrics_port_answers_the_api_names_and_addresses_only(cluster: Cluster) -> None:
    """REACTQ_API_METRICS_PORT's listener (tenants, spend), as compose and the manifests run it: Prometheus
    scrapes it by the service name (compose) or the pod's IP (Kubernetes); a re-pointed name gets 400."""
    make_key(cluster, "default")
    port = free_port()
    cluster.env.update({"REACTQ_API_METRICS_PORT": str(port), "REACTQ_API_ALLOWED_HOSTS": '["localhost", "api"]'})
    api = start_api(cluster)
    try:
        wait_for_port(port, owner=api.proc)
        url = f"http://127.0.0.1:{port}/metrics"
        for host in (f"{FOREIGN}:{port}", FOREIGN, "api.attacker.example"):
            refused = httpx.get(url, headers={"Host": host}, timeout=10)
            assert refused.status_code == 400 and "reactq_" not in refused.text, host
        for host in (f"api:{port}", f"127.0.0.1:{port}", f"10.1.2.3:{port}", f"[::1]:{port}", "localhost"):
            page = httpx.get(url, headers={"Host": host}, timeout=10)
            assert page.status_code == 200 and "reactq_queue_depth" in page.text, host
    finally:
        api.stop()


def _env(container: dict[str, Any], name: str) -> str:
    return next(e["value"] for e in container.get("env", []) if e["name"] == name)


def test_the_deployments_set_the_names_their_clients_and_probes_use() -> None:
    compose = yaml.safe_load(compose_config(SECRETS).stdout)["services"]["api"]
    allowed = AllowedHosts(yaml.safe_load(compose["environment"]["REACTQ_API_ALLOWED_HOSTS"]))
    probe = " ".join(compose["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/healthz" in probe and allowed.allows("127.0.0.1:8000")
    assert allowed.allows("localhost:8000") and allowed.allows("api:8000") and not allowed.allows(FOREIGN)

    [deployment] = [o for o in kustomize("base") if o["kind"] == "Deployment" and o["metadata"]["name"] == "api"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    allowed = AllowedHosts(yaml.safe_load(_env(container, "REACTQ_API_ALLOWED_HOSTS")))
    for name in ("api", "api.reactq", "api.reactq.svc", "api.reactq.svc.cluster.local"):
        assert allowed.allows(f"{name}:8000"), name
    assert not allowed.allows(FOREIGN) and not allowed.allows("10.1.2.3:8000")  # a pod IP: probes say a name
    for probe_name in ("livenessProbe", "readinessProbe"):
        headers = {h["name"]: h["value"] for h in container[probe_name]["httpGet"]["httpHeaders"]}
        assert allowed.allows(headers["Host"]), probe_name
