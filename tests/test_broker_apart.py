"""The broker on its own Redis (REACTQ_BROKER_URL), plain or Sentinel-managed, apart from the runs' state.

Real redis-server processes: the state Redis of the test cluster, a second one as the broker, and for
Sentinel a primary, a replica and three sentinels on loopback. A batch runs through real workers; the step
lists and kombu's unacked hash are on the broker and nothing of a run is; a worker killed mid-batch and a
broker primary SIGKILLed mid-batch (Sentinel promotes the replica) leave every run answered, none twice.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import Cluster
from tests.fixtures_services import RedisServer, free_port, wait_for_port
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import batch_under_way
from tests.waiting import wait_for
from worker.config import Settings
from worker.names import STEPS_QUEUE, queue_lists

pytestmark = pytest.mark.integration
MASTER = "reactq-broker"


def _run_keys(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter("reactq:run:*", count=1000))


def test_a_broker_on_another_redis_runs_a_batch_through_a_killed_worker(
        cluster: Cluster, own_redis: RedisServer, stub_control: StubControl, tmp_path: Path) -> None:
    broker = own_redis  # a second redis-server: the cluster's state is on the session's
    cluster.env["REACTQ_BROKER_URL"] = broker.url
    victim, batch, _, out, expected = batch_under_way(cluster, stub_control, tmp_path, 300, 8)
    broker_client = redis.Redis.from_url(broker.url)
    state = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    assert any(broker_client.exists(name) for name in queue_lists(STEPS_QUEUE)) or broker_client.hlen("unacked")
    cluster.kill(victim)  # its reserved steps are stranded in the broker's unacked hash
    cluster.start_worker(queues="steps", concurrency=16)
    stderr = cluster.finish_batch(batch)
    assert batch.returncode == 0, stderr[-3000:]
    assert_all_answered(out, expected)
    # the runs are in the state Redis only; the queues in the broker only
    assert _run_keys(state) and not _run_keys(broker_client)
    assert not any(state.exists(name) for name in queue_lists(STEPS_QUEUE)) and not state.exists("unacked")


def test_the_broker_url_is_checked() -> None:
    with pytest.raises(ValueError, match="REACTQ_BROKER_SENTINEL_MASTER"):
        Settings(broker_url="sentinel://127.0.0.1:26379")
    with pytest.raises(ValueError, match="redis://, rediss:// or sentinel://"):
        Settings(broker_url="amqp://guest@localhost//")
    assert not Settings(broker_url=None).broker_apart
    assert Settings(redis_url="redis://a:6379/0", broker_url="redis://b:6379/0").broker_apart


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
        wait_for_port(self.replica_port)
        for i, port in enumerate(self.sentinel_ports):
            conf = self.workdir / f"sentinel-{i}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 2\n"
                            f"sentinel down-after-milliseconds {MASTER} 1000\n"
                            f"sentinel failover-timeout {MASTER} 5000\nsentinel parallel-syncs {MASTER} 1\n")
            self.procs.append(subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
            wait_for_port(port)
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

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)
        self.primary.stop()


@pytest.fixture
def sentinel_broker(tmp_path: Path) -> Iterator[SentinelBroker]:
    broker = SentinelBroker(tmp_path / "sentinel")
    broker.start()
    yield broker
    broker.stop()


def test_a_sentinel_broker_fails_over_mid_batch_and_every_run_is_answered(
        cluster: Cluster, sentinel_broker: SentinelBroker, stub_control: StubControl, tmp_path: Path) -> None:
    cluster.env["REACTQ_BROKER_URL"] = sentinel_broker.url
    cluster.env["REACTQ_BROKER_SENTINEL_MASTER"] = MASTER
    _, batch, _, out, expected = batch_under_way(cluster, stub_control, tmp_path, 300, 8)
    assert sentinel_broker.master_port() == sentinel_broker.primary.port
    assert sentinel_broker.primary.proc is not None
    sentinel_broker.primary.proc.kill()  # SIGKILL: what the replica had not received yet is gone
    sentinel_broker.primary.proc.wait(10)
    sentinel_broker.primary.proc = None
    wait_for("Sentinel to promote the replica", sentinel_broker.master_port, 60, 0.2,
             until=lambda port: port == sentinel_broker.replica_port)
    stderr = cluster.finish_batch(batch, timeout=300)
    assert batch.returncode == 0, stderr[-3000:]
    assert_all_answered(out, expected)
    stats = stub_control.stats()
    assert stats["completions"] <= 2 * len(expected) * 3, stats  # repeated calls stay bounded
