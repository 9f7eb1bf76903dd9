"""A real Redis Cluster and a real Sentinel-managed Redis on loopback, built the way the deployments build
them (docker-compose.yml's `cluster` profile, deploy/k8s/redis-cluster): every node started by
deploy/redis/start.sh with deploy/redis/acl.conf and every role's password, the cluster joined by
`redis-cli --cluster create` logged in as `cluster-admin`, sentinels started by deploy/redis/sentinel.sh.

- `acl_cluster(workdir, redis_server)`: 3 primaries and a replica each (cluster-node-timeout 2000 ms);
- `sentinel_broker(workdir)`: a primary, its replica and 3 sentinels (down-after 1000 ms)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.fixtures_alerting import PASSWORDS, REDIS_DIR, binary
from tests.fixtures_prometheus import stop_group
from tests.fixtures_redis_cluster import node_port
from tests.fixtures_services import free_port, wait_for_port
from tests.waiting import wait_for

INFRA_PASSWORDS = {"REDIS_REPLICA_PASSWORD": "pw-replica", "REDIS_SENTINEL_PASSWORD": "pw-sentinel",
                   "REDIS_CLUSTER_ADMIN_PASSWORD": "pw-cluster-admin"}
ALL_PASSWORDS = {**PASSWORDS, **INFRA_PASSWORDS}
BROKER_MASTER = "reactq-broker"


def password(user: str) -> str:
    return ALL_PASSWORDS[f"REDIS_{user.upper().replace('-', '_')}_PASSWORD"]


@dataclass
class Nodes:
    """redis-server processes of one test; `ports` in start order."""

    workdir: Path
    server: str
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, port: int, *args: str) -> None:
        data = self.workdir / str(port)
        data.mkdir()
        env = {**os.environ, **ALL_PASSWORDS, "TMPDIR": str(data),
               "PATH": f"{Path(self.server).parent}:{os.environ['PATH']}"}
        self.procs[port] = subprocess.Popen(
            ["sh", str(REDIS_DIR / "start.sh"), str(REDIS_DIR / "acl.conf"), "--port", str(port), "--bind",
             "127.0.0.1", "--dir", str(data), "--save", "", *args],
            env=env, stdout=(data / "redis.log").open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        self.ports.append(port)
        wait_for_port(port, timeout=30, owner=self.procs[port])

    def client(self, port: int, user: str = "exporter") -> redis.Redis:
        return redis.Redis(port=port, username=user, password=password(user), decode_responses=True,
                           socket_timeout=5)

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_group(proc)


def roles(nodes: Nodes) -> dict[int, str]:
    return {port: nodes.client(port).info("replication")["role"] for port in nodes.procs}


@contextmanager
def acl_cluster(workdir: Path, redis_server: str) -> Iterator[Nodes]:
    nodes = Nodes(workdir, redis_server)
    try:
        for _ in range(6):
            nodes.start(node_port(), "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                        "--maxmemory", "2gb", "--maxmemory-policy", "noeviction")
        created = subprocess.run(
            [binary("redis-cli", "redis-tools"), "--user", "cluster-admin", "--cluster", "create",
             *[f"127.0.0.1:{p}" for p in nodes.ports], "--cluster-replicas", "1", "--cluster-yes"],
            env={**os.environ, "REDISCLI_AUTH": INFRA_PASSWORDS["REDIS_CLUSTER_ADMIN_PASSWORD"]},
            capture_output=True, text=True, timeout=120)
        assert created.returncode == 0, created.stdout[-3000:] + created.stderr[-2000:]
        assert "[OK] All 16384 slots covered" in created.stdout
        for port in nodes.ports:
            wait_for(f"cluster_state:ok on {port}", lambda p=port: nodes.client(p).execute_command("CLUSTER INFO"),
                     60, 0.2, until=lambda info: info.get("cluster_state") == "ok")
        # the replicas copy their primaries as the `replica` user (start.sh's masteruser/masterauth)
        wait_for("every replica's link to its primary", lambda: [
            nodes.client(p).info("replication").get("master_link_status") for p in nodes.procs
            if roles(nodes)[p] == "slave"], 60, 0.2, until=lambda links: links == ["up"] * 3)
        yield nodes
    finally:
        nodes.stop()


@dataclass
class SentinelBroker:
    nodes: Nodes
    sentinel_ports: list[int]
    sentinels: list[subprocess.Popen[bytes]]

    def master_port(self) -> int:
        sentinel = redis.Redis(port=self.sentinel_ports[0], socket_timeout=5)
        try:
            return int(sentinel.sentinel_get_master_addr_by_name(BROKER_MASTER)[1])
        finally:
            sentinel.close()

    def url(self, user: str) -> str:
        first, *others = self.sentinel_ports
        return ";".join([f"sentinel://{user}:{password(user)}@127.0.0.1:{first}",
                         *[f"sentinel://127.0.0.1:{p}" for p in others]])


@contextmanager
def sentinel_broker(workdir: Path, redis_server: str) -> Iterator[SentinelBroker]:
    nodes = Nodes(workdir, redis_server)
    sentinels: list[subprocess.Popen[bytes]] = []
    try:
        primary, replica = free_port(), free_port()
        nodes.start(primary)
        nodes.start(replica, "--replicaof", "127.0.0.1", str(primary))
        wait_for("the broker replica's link", lambda: nodes.client(replica).info("replication")
                 .get("master_link_status"), 30, 0.2, until=lambda link: link == "up")
        ports = [free_port() for _ in range(3)]
        for port in ports:
            data = workdir / f"sentinel-{port}"
            data.mkdir()
            env = {**os.environ, "REDIS_SENTINEL_PASSWORD": INFRA_PASSWORDS["REDIS_SENTINEL_PASSWORD"],
                   "SENTINEL_DIR": str(data), "SENTINEL_DOWN_AFTER_MS": "1000",
                   "SENTINEL_FAILOVER_TIMEOUT_MS": "5000", "PATH": f"{Path(redis_server).parent}:{os.environ['PATH']}"}
            sentinels.append(subprocess.Popen(
                ["sh", str(REDIS_DIR / "sentinel.sh"), BROKER_MASTER, "127.0.0.1", str(primary), "2",
                 "--port", str(port), "--bind", "127.0.0.1"],
                env=env, stdout=(data / "sentinel.log").open("wb"), stderr=subprocess.STDOUT,
                start_new_session=True))
            wait_for_port(port, timeout=30, owner=sentinels[-1])
        broker = SentinelBroker(nodes, ports, sentinels)
        wait_for("every sentinel to know the replica and the other sentinels", lambda: [
            redis.Redis(port=p, decode_responses=True).sentinel_master(BROKER_MASTER) for p in ports], 60, 0.3,
            until=lambda masters: all(m["num-slaves"] == 1 and m["num-other-sentinels"] == 2 for m in masters))
        yield broker
    finally:
        for proc in sentinels:
            stop_group(proc)
        nodes.stop()
