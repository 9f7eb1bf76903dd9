"""Run state on a Redis Cluster, the broker on a Sentinel-managed Redis: the deployment files for it, checked
with the real tools (docker-compose config, kubectl kustomize, promtool) and on real processes.

- The Redis users of deploy/redis/acl.conf work on every node of a real 3-primary/3-replica cluster: each
  app role connects with redis-py's RedisCluster (CLUSTER SLOTS on connect) and reaches every shard, the
  replicas copy their primaries as `replica`, the cluster is created as `cluster-admin`.
- Debian's redis_exporter 1.45 scrapes every node through one exporter (/scrape?target=), as `exporter`,
  with nothing refused; a real Prometheus with the shipped cluster job and rule files evaluates the
  dashboard's per-shard panels (a line per node) and, when a primary is SIGKILLed, ReactqRedisFailover
  fires for the replica that took over and ReactqRedisDown goes pending for the killed node.
- A Sentinel broker (deploy/redis/sentinel.sh, sentinels logged in as `sentinel`) fails over, and the
  app's broker client follows it logged in as its role's user.
- A sandboxed run goes through with the API, a step worker and a sandbox worker each on its own user of the
  cluster and of the Sentinel broker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from redis.cluster import RedisCluster

from tests.fixtures_acl_cluster import BROKER_MASTER, INFRA_PASSWORDS, acl_cluster, password, roles, sentinel_broker
from tests.fixtures_alerting import PASSWORDS, prometheus, redis_exporter
from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import Cluster
from tests.fixtures_k8s import kustomize
from tests.fixtures_prometheus import PROMETHEUS_DIR, promtool_binary, scrape, total
from tests.test_deploy import COMPOSE, ROOT, SECRETS, compose_config
from tests.test_redis_exporter import redis_names_in_rules, redis_servers
from tests.waiting import wait_for
from worker.store.connection import connect_broker

APP_USERS = ["api", "step-worker", "sandbox-worker"]
CLUSTER_OVERRIDE = ROOT / "deploy" / "compose.cluster.yml"
CLUSTER_PROMETHEUS = PROMETHEUS_DIR / "prometheus-cluster.yml"
K8S_BASE_PROMETHEUS = ROOT / "deploy" / "k8s" / "base" / "prometheus" / "prometheus.yml"
K8S_CLUSTER_PROMETHEUS = ROOT / "deploy" / "k8s" / "redis-cluster" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "reactq-overview.json"
SHARD_PANELS = ["Memory per shard", "Commands per second per shard", "CPU per shard (cores)"]
CLUSTER_JOBS = {"reactq-redis-cluster", "reactq-redis-broker"}


def deployed_redis_server() -> str:
    """Redis 7 (Debian's), as the deployments' redis:7 image, when this machine has it."""
    return "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else redis_servers()[0]


def key_per_primary(client: RedisCluster, prefix: str) -> list[str]:
    """One hash-tagged key per primary: `prefix{tag}` for the first tags that land on each shard."""
    found: dict[str, str] = {}
    for i in range(200):
        key = f"{prefix}{{run-{i}}}"
        node = client.get_node_from_key(key)
        found.setdefault(node.name, key)
    return list(found.values())


@pytest.mark.integration
@pytest.mark.parametrize("redis_server", redis_servers())
def test_every_app_user_reaches_every_shard_with_redis_py_cluster(tmp_path: Path, redis_server: str) -> None:
    with acl_cluster(tmp_path, redis_server) as nodes:
        for user in APP_USERS:
            client = RedisCluster(host="127.0.0.1", port=nodes.ports[0], username=user, password=password(user),
                                  socket_timeout=5)
            prefix = "reactq:run:" if user != "sandbox-worker" else "reactq:sandbox:"
            keys = key_per_primary(client, prefix)
            assert len(keys) == 3, keys  # the seed node's CLUSTER SLOTS named all three primaries
            for key in keys:
                client.set(key, user)
                assert client.get(key) == user.encode()
            client.close()
        # the exporter and KEDA users never connect as cluster clients: CLUSTER SLOTS is refused them
        with pytest.raises(redis.exceptions.RedisClusterException):
            RedisCluster(host="127.0.0.1", port=nodes.ports[0], username="keda", password=password("keda"))
        assert sorted(roles(nodes).values()) == ["master"] * 3 + ["slave"] * 3


def cluster_job(config_path: Path, targets: list[str], exporter: str) -> dict[str, Any]:
    """The shipped reactq-redis-cluster job of `config_path`, aimed at this test's nodes and exporter."""
    [job] = [j for j in yaml.safe_load(config_path.read_text())["scrape_configs"]
             if j["job_name"] == "reactq-redis-cluster"]
    job["static_configs"] = [{"targets": targets}]
    [to_exporter] = [r for r in job["relabel_configs"] if r.get("target_label") == "__address__"]
    to_exporter["replacement"] = exporter
    return job


def shard_panel_queries() -> dict[str, str]:
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    return {title: panels[title]["targets"][0]["expr"].replace("$namespace", ".*").replace("$job", ".*")
            .replace("$__rate_interval", "30s") for title in SHARD_PANELS}


@pytest.mark.integration
def test_one_exporter_scrapes_every_node_and_a_real_failover_fires_the_failover_alert(tmp_path: Path) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "prometheus").mkdir()
    with acl_cluster(tmp_path / "cluster", deployed_redis_server()) as nodes, \
            redis_exporter(tmp_path, f"redis://127.0.0.1:{nodes.ports[0]}", "exporter",
                           PASSWORDS["REDIS_EXPORTER_PASSWORD"]) as exporter:
        targets = [f"127.0.0.1:{p}" for p in nodes.ports]
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(PROMETHEUS_DIR / "recording.rules.yml"), str(PROMETHEUS_DIR / "alerts.rules.yml")],
                  "scrape_configs": [cluster_job(CLUSTER_PROMETHEUS, targets, exporter.address)]}
        with prometheus(tmp_path / "prometheus", config) as prom:
            up = wait_for("redis_up 1 for all six nodes", lambda: prom.query('redis_up{job="reactq-redis-cluster"}'),
                          60, 0.5, until=lambda r: len(r) == 6 and all(s["value"][1] == "1" for s in r))
            assert {s["metric"]["instance"] for s in up} == set(targets)  # `instance` names the node
            # Every redis_* name the rules and the dashboard read is exported by a cluster node.
            samples = scrape(f"http://{exporter.address}/scrape?target=redis://{targets[0]}")
            assert total(samples, "redis_cluster_state") == 1 and total(samples, "redis_cluster_enabled") == 1
            exported = {name for name, _ in samples}
            assert redis_names_in_rules() <= exported, redis_names_in_rules() - exported
            # The per-shard panels: one line per node, every node's own value.
            for title, expr in shard_panel_queries().items():
                lines = wait_for(title, lambda e=expr: prom.query(e), 30, 0.5, until=lambda r: len(r) == 6)
                assert {s["metric"]["instance"] for s in lines} == set(targets), title
                assert all(float(s["value"][1]) >= 0 for s in lines), title
            assert "NOPERM" not in exporter.log() and "level=error" not in exporter.log()

            before = roles(nodes)
            victim = nodes.ports[0]
            assert before[victim] == "master"
            nodes.kill(victim)
            promoted = wait_for("a replica to take over", lambda: roles(nodes), 60, 0.2,
                                until=lambda now: sum(r == "master" for r in now.values()) == 3)
            [new_primary] = [p for p, r in promoted.items() if r == "master" and before[p] == "slave"]
            firing = wait_for("ReactqRedisFailover", lambda: prom.api("alerts")["alerts"], 60, 0.5,
                              until=lambda alerts: any(a["labels"]["alertname"] == "ReactqRedisFailover"
                                                       and a["state"] == "firing" for a in alerts))
            failovers = {a["labels"]["instance"] for a in firing if a["labels"]["alertname"] == "ReactqRedisFailover"}
            assert failovers == {f"127.0.0.1:{new_primary}"}
            down = {a["labels"]["instance"] for a in firing if a["labels"]["alertname"] == "ReactqRedisDown"}
            assert down == {f"127.0.0.1:{victim}"}  # pending: it waits a minute before it fires
            assert wait_for("cluster_state ok again", lambda: prom.value(
                'min(redis_cluster_state{job="reactq-redis-cluster"})'), 30, 0.5, until=lambda v: v == 1)


@pytest.mark.integration
def test_sentinels_fail_the_broker_over_as_the_sentinel_user_and_the_app_follows(tmp_path: Path) -> None:
    with sentinel_broker(tmp_path, deployed_redis_server()) as broker:
        primary, replica = broker.nodes.ports
        client = connect_broker(broker.url("step-worker"), BROKER_MASTER)
        client.rpush("reactq.steps", "m1")
        assert broker.master_port() == primary
        broker.nodes.kill(primary)
        wait_for("Sentinel to promote the replica", broker.master_port, 60, 0.2, until=lambda p: p == replica)
        # the replica had the message; the app's client, logged in as step-worker, writes to the new primary
        assert client.rpush("reactq.steps", "m2") == 2
        assert broker.nodes.client(replica, "step-worker").lrange("reactq.steps", 0, -1) == ["m1", "m2"]


@pytest.mark.integration
def test_a_sandboxed_run_goes_through_with_each_role_on_its_own_user_of_the_cluster_and_the_broker(
        cluster_env: dict[str, str], tmp_path: Path) -> None:
    """The API, a step worker and a sandbox worker, each logged in as its own ACL user to every cluster node
    and to the Sentinel broker's primary, as the deployments set them up: a python run is answered."""
    (tmp_path / "cluster").mkdir()
    (tmp_path / "broker").mkdir()
    with acl_cluster(tmp_path / "cluster", deployed_redis_server()) as nodes, \
            sentinel_broker(tmp_path / "broker", deployed_redis_server()) as broker:
        def urls(user: str) -> dict[str, str]:
            return {"REACTQ_REDIS_URL": f"redis+cluster://{user}:{password(user)}@127.0.0.1:{nodes.ports[0]}",
                    "REACTQ_BROKER_URL": broker.url(user), "REACTQ_BROKER_SENTINEL_MASTER": BROKER_MASTER}
        c = Cluster({**cluster_env, **urls("api")}, tmp_path)
        try:
            key = make_key(c, "acl-tenant", "standard", via_cli=True)  # the CLI, as the api user
            c.start_worker(queues="steps", concurrency=4, **urls("step-worker"))
            c.start_worker(queues="sandbox", concurrency=2, **urls("sandbox-worker"))
            api = start_api(c)
            try:
                client = api.client(key)
                run_id = client.post("/v1/runs", json={"question": "What is the sum of the first 10 primes?"}
                                     ).json()["run_id"]
                run = wait_for(f"run {run_id} to finish",
                               lambda: client.get(f"/v1/runs/{run_id}", params={"trace": True}).json(), 120, 0.3,
                               until=lambda polled: polled["status"] not in ("queued", "running"))
            finally:
                api.stop()
            assert run["status"] == "succeeded" and run["answer"] == "129", run
            assert run["trace"][0]["tool_calls"][0]["name"] == "python"
            logs = "".join(c.log(proc) for proc in c.procs)
            assert "NOPERM" not in logs and "WRONGPASS" not in logs
        finally:
            c.stop()


# ---- docker compose: the `cluster` profile and deploy/compose.cluster.yml ----

CLUSTER_SECRETS = {**SECRETS, **INFRA_PASSWORDS}


def cluster_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary
    return subprocess.run([binary, "-f", str(COMPOSE), "-f", str(CLUSTER_OVERRIDE), "--project-directory",
                           str(ROOT / "deploy"), "--profile", "cluster", "config"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_the_default_stack_is_unchanged_without_the_profile() -> None:
    rendered = compose_config(SECRETS, "--services")  # no infrastructure passwords: still valid
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(compose_config(SECRETS).stdout)["services"]
    cluster_only = {name for name, s in services.items() if "cluster" in s.get("profiles", [])}
    assert cluster_only == {*(f"redis-node-{i}" for i in range(6)), "redis-cluster-create", "broker-0",
                            "broker-1", "sentinel-0", "sentinel-1", "sentinel-2", "redis-cluster-exporter"}
    assert services["api"]["environment"]["REACTQ_REDIS_URL"] == "redis://api:pw-api@redis:6379/0"
    assert "REACTQ_BROKER_URL" not in services["api"]["environment"]


def test_the_cluster_profile_points_the_app_at_the_cluster_and_the_sentinels() -> None:
    missing = cluster_config(SECRETS)
    assert missing.returncode != 0 and "scripts/compose-secrets.sh" in missing.stderr  # infra passwords required
    rendered = cluster_config(CLUSTER_SECRETS)
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(rendered.stdout)["services"]
    for user in APP_USERS:
        env = services[user]["environment"]
        assert env["REACTQ_REDIS_URL"] == f"redis+cluster://{user}:pw-{user}@redis-cluster:6379"
        assert env["REACTQ_BROKER_URL"] == (f"sentinel://{user}:pw-{user}@sentinel-0:26379;"
                                            "sentinel://sentinel-1:26379;sentinel://sentinel-2:26379")
        assert env["REACTQ_BROKER_SENTINEL_MASTER"] == BROKER_MASTER
        assert services[user]["depends_on"]["redis-cluster-create"] == {"condition": "service_completed_successfully"}
    for i in range(6):
        node = services[f"redis-node-{i}"]
        assert "--cluster-enabled yes" in node["command"]
        assert f"--cluster-announce-hostname redis-node-{i}" in node["command"]
        assert node["networks"]["default"]["aliases"] == ["redis-cluster"]  # the app's seed: any node up
        assert node["entrypoint"][1:] == ["/etc/reactq-redis/start.sh", "/etc/reactq-redis/acl.conf"]
        assert node["environment"]["REDIS_REPLICA_PASSWORD"] == "pw-replica"
    create = " ".join(services["redis-cluster-create"]["command"])
    assert "--cluster-replicas 1" in create and "--user cluster-admin" in create
    assert "--replicaof broker-0 6379" in services["broker-1"]["command"]
    assert [services[f"sentinel-{i}"]["entrypoint"][2:] for i in range(3)] == [
        [BROKER_MASTER, "broker-0", "6379", "2"]] * 3
    assert services["redis-cluster-exporter"]["environment"]["REDIS_USER"] == "exporter"
    assert "--config.file=/etc/prometheus/prometheus-cluster.yml" in services["prometheus"]["command"]
    published = {name for name, s in services.items() if s.get("ports")}
    assert published == {"api", "prometheus", "grafana"}  # no Redis node, sentinel or exporter published


# ---- Prometheus: the cluster variants of the scrape configs ----

def test_the_cluster_scrape_configs_are_the_shipped_ones_plus_the_cluster_jobs() -> None:
    """Compose keeps its single Redis (an override cannot remove it) and its job; the k8s overlay has none."""
    for base, variant, exporter, gone in ((PROMETHEUS_DIR / "prometheus.yml", CLUSTER_PROMETHEUS,
                                           "redis-cluster-exporter:9121", set()),
                                          (K8S_BASE_PROMETHEUS, K8S_CLUSTER_PROMETHEUS,
                                           "redis-cluster-exporter.reactq.svc.cluster.local:9121", {"reactq-redis"})):
        done = subprocess.run([promtool_binary(), "check", "config", str(variant)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        shipped, cluster = yaml.safe_load(base.read_text()), yaml.safe_load(variant.read_text())
        shipped["scrape_configs"] = [j for j in shipped["scrape_configs"] if j["job_name"] not in gone]
        extra = [j for j in cluster["scrape_configs"] if j["job_name"] in CLUSTER_JOBS]
        assert {**cluster, "scrape_configs": [j for j in cluster["scrape_configs"] if j not in extra]} == shipped
        assert {j["job_name"] for j in extra} == CLUSTER_JOBS
        for job in extra:
            assert job["metrics_path"] == "/scrape"
            relabel = {r["target_label"]: r for r in job["relabel_configs"]}
            assert relabel["__address__"]["replacement"] == exporter
            assert relabel["instance"]["source_labels"] == ["__address__"]
            assert relabel["__param_target"]["replacement"] == "redis://$1"
        nodes = [t for t in extra[0]["static_configs"][0]["targets"]]
        assert len(nodes) == 6 and all(t.endswith(":6379") for t in nodes)


# ---- Kubernetes: the redis-cluster overlay ----

def overlay() -> list[dict[str, Any]]:
    return list(kustomize("redis-cluster"))


def by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_the_overlay_replaces_the_single_redis_with_a_cluster_and_a_sentinel_broker() -> None:
    objects = by_kind_name(overlay())
    base = by_kind_name(list(kustomize("base")))
    assert ("StatefulSet", "redis") in base and ("StatefulSet", "redis") not in objects
    cluster = objects[("StatefulSet", "redis-cluster")]
    assert cluster["spec"]["replicas"] == 6
    [node] = cluster["spec"]["template"]["spec"]["containers"]
    args = " ".join(node["command"] + node.get("args", []))
    assert "/etc/reactq-redis/start.sh /etc/reactq-redis/acl.conf" in args and "cluster-enabled yes" in args
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in node["env"]
           if "secretKeyRef" in e.get("valueFrom", {})}
    assert env["REDIS_REPLICA_PASSWORD"] == "replica" and env["REDIS_CLUSTER_ADMIN_PASSWORD"] == "cluster-admin"
    seed = objects[("Service", "redis-cluster")]  # the app's seed: any node that is up
    assert seed["spec"]["selector"] == cluster["spec"]["selector"]["matchLabels"] and "clusterIP" not in seed["spec"]
    job = objects[("Job", "redis-cluster-create")]
    create = " ".join(job["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "--cluster create" in create and "--cluster-replicas 1" in create
    assert objects[("StatefulSet", "redis-broker")]["spec"]["replicas"] == 2
    assert objects[("StatefulSet", "redis-sentinel")]["spec"]["replicas"] == 3
    for user in APP_USERS:
        spec = objects[("Deployment", user)]["spec"]["template"]["spec"]
        [app] = [c for c in spec["containers"] if any(e["name"] == "REACTQ_REDIS_URL" for e in c.get("env", []))]
        names = [e["name"] for e in app["env"]]
        # $(REDIS_PASSWORD) expands only when it is defined before the URLs, and it is the role's key
        assert names.index("REDIS_PASSWORD") < names.index("REACTQ_REDIS_URL") < names.index("REACTQ_BROKER_URL")
        assert app["env"][names.index("REDIS_PASSWORD")]["valueFrom"]["secretKeyRef"]["key"] == user
        values = {e["name"]: e.get("value") for e in app["env"]}
        assert values["REACTQ_REDIS_URL"] == f"redis+cluster://{user}:$(REDIS_PASSWORD)@redis-cluster:6379"
        assert values["REACTQ_BROKER_URL"].startswith(f"sentinel://{user}:$(REDIS_PASSWORD)@redis-sentinel-0.")
        assert values["REACTQ_BROKER_SENTINEL_MASTER"] == BROKER_MASTER
    [config] = [o for (kind, name), o in objects.items()
              if kind == "ConfigMap" and name.startswith("prometheus-config")]
    assert yaml.safe_load(config["data"]["prometheus.yml"]) == yaml.safe_load(K8S_CLUSTER_PROMETHEUS.read_text())


def test_the_overlays_redis_pods_are_reached_only_by_the_app_and_each_other() -> None:
    policies = [o for o in overlay() if o["kind"] == "NetworkPolicy"
                and o["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") in
                {"redis-cluster", "redis-broker", "redis-sentinel"}]
    assert {p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in policies} == {
        "redis-cluster", "redis-broker", "redis-sentinel"}
    for policy in policies:
        sources = {f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
                   for rule in policy["spec"]["ingress"] for f in rule["from"]}
        values = {v for rule in policy["spec"]["ingress"] for f in rule["from"]
                  for e in f["podSelector"].get("matchExpressions", []) if e["key"] == "app.kubernetes.io/component"
                  for v in e["values"]}
        assert sources | values <= {None, "api", "step-worker", "sandbox-worker", "redis-cluster", "redis-broker",
                                    "redis-sentinel", "redis-cluster-exporter", "redis-cluster-create"}, policy
        assert "sandbox-worker" in values and re.search(r"redis", policy["metadata"]["name"])
    # the cluster bus (16379) is open to the cluster's own nodes only
    [cluster_policy] = [p for p in policies if p["metadata"]["name"] == "redis-cluster-from-reactq-roles"]
    [bus] = [r for r in cluster_policy["spec"]["ingress"] if {"port": 16379, "protocol": "TCP"} in r["ports"]]
    assert bus["from"][0]["podSelector"]["matchExpressions"][1]["values"] == ["redis-cluster"]
