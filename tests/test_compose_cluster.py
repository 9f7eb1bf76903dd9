"""docker-compose.yml's `cluster` profile with deploy/compose.cluster.yml, brought up on the host engine with
the stack's offline images (scripts/build_stack_images.py: Debian's Redis 7 and redis_exporter 1.45): the
one-shot service joins the 6 nodes into a cluster whose CLUSTER SLOTS names the nodes by their service
names, the shipped deploy/prometheus/prometheus-cluster.yml scrapes every node through the one exporter, and
the sentinels (deploy/redis/sentinel.sh, logged in as `sentinel`) move the broker to its replica when the
primary is killed. The app services are not started here (tests/test_compose_stack.py runs the app)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures_cluster import ROOT
from tests.fixtures_services import free_port
from tests.test_compose_stack import stack_images_and_secrets, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.integration]

NODES = [f"redis-node-{i}" for i in range(6)]
REDIS_SERVICES = [*NODES, "redis-cluster-create", "broker-0", "broker-1", "sentinel-0", "sentinel-1", "sentinel-2"]


def test_the_cluster_profile_comes_up_scraped_and_its_broker_fails_over(docker_engine: object,
                                                                          tmp_path: Path) -> None:
    env = stack_images_and_secrets(tmp_path)
    port = free_port()
    env.update(REACTQ_PROMETHEUS_PORT=str(port), REACTQ_TEST_PROMETHEUS_DIR=str(tmp_path))
    images = {name: {"image": env["REACTQ_REDIS_IMAGE"]} for name in REDIS_SERVICES}
    images["redis-cluster-exporter"] = {"image": env["REACTQ_REDIS_EXPORTER_IMAGE"]}
    (tmp_path / "images.yml").write_text(yaml.safe_dump({"services": images}))
    project = f"reactqcluster{os.getpid()}"

    def compose(*args: str, timeout: float = 300) -> str:
        # compose.test.yml: the offline Prometheus image; compose.cluster.yml last, as an operator runs it
        files = [ROOT / "docker-compose.yml", ROOT / "deploy" / "compose.test.yml",
                 ROOT / "deploy" / "compose.cluster.yml", tmp_path / "images.yml"]
        done = subprocess.run(["docker-compose", "-p", project, *[a for f in files for a in ("-f", str(f))],
                               "--profile", "cluster", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"docker-compose {' '.join(args)}: {done.stderr[-4000:]}"
        return done.stdout

    def cli(service: str, *args: str, user: str = "exporter", port: int = 6379) -> str:
        password = f"$REDIS_{user.upper().replace('-', '_')}_PASSWORD" if port == 6379 else ""
        auth = f'--no-auth-warning --user {user} --pass "{password}" ' if password else ""
        return compose("exec", "-T", service, "sh", "-c", f"redis-cli {auth}-p {port} {' '.join(args)}")

    def query(expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}, timeout=10)
        return list(r.raise_for_status().json()["data"]["result"])

    try:
        compose("up", "-d", "--no-build", *REDIS_SERVICES, "redis-cluster-exporter", "prometheus")
        wait_until("redis-cluster-create to exit 0", lambda: compose("ps", "redis-cluster-create"), 180,
                   until=lambda out: "Exit 0" in out)
        # a node reports cluster_state:ok once every slot is served, possibly before gossip has told it of
        # every replica: wait for the whole picture
        whole = ("cluster_state:ok", "cluster_size:3", "cluster_known_nodes:6")
        info = wait_until("cluster_state:ok with 3 primaries and 6 nodes known",
                          lambda: cli("redis-node-5", "cluster", "info"), 60,
                          until=lambda out: all(part in out for part in whole))
        assert all(part in info for part in whole)
        # what RedisCluster reads on connect, as the api user: the nodes by name, not by container address
        def named() -> set[str]:
            return {word for word in cli("redis-node-1", "cluster", "slots", user="api").split()
                    if word.startswith("redis-node-")}
        wait_until("CLUSTER SLOTS to name every primary and replica", named, 60, until=lambda n: n == set(NODES))
        # the app's seed name (compose.cluster.yml) is every node's alias: a node answers it
        assert "cluster_state:ok" in cli("broker-0", "-h", "redis-cluster", "cluster", "info")

        def node_up() -> dict[str, str]:
            return {s["metric"]["instance"]: s["value"][1] for s in query("redis_up")}
        up = wait_until("Prometheus to scrape all 8 nodes through the exporter", node_up, 120, every=2,
                        until=lambda seen: len(seen) == 8 and set(seen.values()) == {"1"})
        assert set(up) == {f"{n}:6379" for n in NODES} | {"broker-0:6379", "broker-1:6379"}
        jobs = {s["metric"]["job"] for s in query("redis_up")}
        assert jobs == {"reactq-redis-cluster", "reactq-redis-broker"}
        # every node's cluster_state:ok once scraped after the join (the shipped config scrapes every 15 s)
        wait_until("cluster_state 1 on every node in Prometheus", lambda: query(
            'count(redis_cluster_state{job="reactq-redis-cluster"} == 1)'), 60, every=2,
            until=lambda r: [s["value"][1] for s in r] == ["6"])

        def master() -> str:
            return cli("sentinel-0", "sentinel", "get-master-addr-by-name", "reactq-broker", port=26379).split()[0]
        assert wait_until("the sentinels to follow broker-0", master, 60, until=lambda m: m == "broker-0")
        compose("kill", "broker-0")
        wait_until("the sentinels to promote broker-1", master, 120, every=2, until=lambda m: m == "broker-1")
        role = cli("broker-1", "info", "replication")
        assert "role:master" in role
    finally:
        compose("down", "-v", "--remove-orphans", "-t", "5", timeout=300)
