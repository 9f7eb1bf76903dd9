"""A real Redis Cluster on loopback, and a Sentinel-managed Redis for the broker. The cluster: six
redis-server processes made into three primaries with a replica each by `redis-cli --cluster create`, and
SIGKILL of a primary with its replica's promotion awaited."""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.fixtures_services import RedisServer, free_port, wait_for_port
from tests.waiting import wait_for
from worker.store import keys

MASTER = "reactq-broker"  # the Sentinel-managed broker's master name
NODE_TIMEOUT_MS = 2000  # how long a primary may be silent before its replica takes over


def node_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, neither in the range the kernel hands out to
    outgoing connections (which could take the bus port between this check and the node's start)."""
    while True:
        port = random.randrange(10000, 22000)  # it and its bus port below the ephemeral range (32768-)
        if all(_free(p) for p in (port, port + 10000)):
            return port


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisClusterNodes:
    def __init__(self, workdir: Path, primaries: int = 3, replicas: int = 1, options: list[str] | None = None) -> None:
        self.workdir = workdir
        self.ports = [node_port() for _ in range(primaries * (1 + replicas))]
        self.replicas = replicas
        self.options = options or []  # more redis-server arguments, after ours (a later one wins)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The contract's form: one seed node."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def start_node(self, port: int) -> None:
        node_dir = self.workdir / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "yes", "--appendfsync", "everysec",
             "--save", "", "--maxmemory-policy", "noeviction", "--logfile", str(node_dir / "redis.log"),
             *self.options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(port, owner=self.procs[port])

    def start(self) -> None:
        for port in self.ports:
            self.start_node(port)
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        self.wait_healthy()

    def wait_healthy(self) -> None:
        """Until every live node says the cluster is ok and every primary has its replicas."""
        def state() -> list[str]:
            found = []
            for port, proc in self.procs.items():
                if proc.poll() is None:
                    client = redis.Redis(port=port, socket_timeout=2)
                    try:
                        found.append(client.cluster("info").get("cluster_state"))
                    finally:
                        client.close()
            return found

        wait_for("the Redis Cluster to be ok on every node", state, 60, 0.2,
                 until=lambda states: bool(states) and all(s == "ok" for s in states))

    def client(self) -> RedisCluster:
        """A client seeded with every live node (the first may be the one a test killed)."""
        live = [ClusterNode("127.0.0.1", p) for p, proc in self.procs.items() if proc.poll() is None]
        return RedisCluster(startup_nodes=live)

    def primary_of(self, key: str) -> int:
        """The port of the primary serving `key` now."""
        cluster = self.client()
        try:
            return int(cluster.get_node_from_key(key).port)
        finally:
            cluster.close()

    def kill(self, port: int) -> None:
        """SIGKILL one node: what its replicas had not received is gone."""
        proc = self.procs[port]
        proc.kill()
        proc.wait(10)

    def roles(self) -> dict[int, str]:
        out = {}
        for port, proc in self.procs.items():
            if proc.poll() is None:
                client = redis.Redis(port=port, socket_timeout=2)
                try:
                    out[port] = client.info("replication")["role"]
                finally:
                    client.close()
        return out

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterNodes]:
    nodes = RedisClusterNodes(tmp_path / "redis-cluster")
    try:
        nodes.start()
        keys.use_hash_tags(True)  # this process reads the cluster's keys as its workers name them
        yield nodes
    finally:
        keys.use_hash_tags(False)
        nodes.stop()


class SentinelBroker:
    """A primary, its replica and three sentinels watching them, on free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary = RedisServer(workdir / "primary")
        self.replica_port = free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def start(self) -> None:
        self.primary.workdir.mkdir(parents=True)
        self.primary.start()
        replica_dir = self.workdir / "replica"
        replica_dir.mkdir()
        self.procs.append(subprocess.Popen(
            ["redis-server", "--port", str(self.replica_port), "--bind", "127.0.0.1", "--dir", str(replica_dir),
             "--appendonly", "yes", "--save", "", "--replicaof", "127.0.0.1", str(self.primary.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for_port(self.replica_port, owner=self.procs[-1])
        for i, port in enumerate(self.sentinel_ports):
            conf = self.workdir / f"sentinel-{i}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 2\n"
                            f"sentinel down-after-milliseconds {MASTER} 1000\n"
                            f"sentinel failover-timeout {MASTER} 5000\nsentinel parallel-syncs {MASTER} 1\n")
            self.procs.append(subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
            wait_for_port(port, owner=self.procs[-1])
        replica = redis.Redis(port=self.replica_port)
        wait_for("the replica to sync with the primary", lambda: replica.info("replication"), 30, 0.1,
                 until=lambda info: info.get("master_link_status") == "up")
        replica.close()

    def master_port(self) -> int:
        sentinel = redis.Redis(port=self.sentinel_ports[0])
        try:
            return int(sentinel.sentinel_get_master_addr_by_name(MASTER)[1])
        finally:
            sentinel.close()

    def fail_over(self) -> None:
        """SIGKILL the primary (what its replica had not received yet is gone) and wait until Sentinel has
        promoted the replica."""
        assert self.master_port() == self.primary.port and self.primary.proc is not None
        self.primary.proc.kill()
        self.primary.proc.wait(10)
        self.primary.proc = None
        wait_for("Sentinel to promote the replica", self.master_port, 60, 0.2,
                 until=lambda port: port == self.replica_port)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)
        self.primary.stop()


@pytest.fixture
def sentinel_broker(tmp_path: Path) -> Iterator[SentinelBroker]:
    broker = SentinelBroker(tmp_path / "sentinel")
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
