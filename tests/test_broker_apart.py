"""The broker on its own Redis (REACTQ_BROKER_URL), plain or Sentinel-managed, apart from the runs' state.

Real redis-server processes: the state Redis of the test cluster, a second one as the broker, and for
Sentinel a primary, a replica and three sentinels on loopback. A batch runs through real workers; the step
lists and kombu's unacked hash are on the broker and nothing of a run is; a worker killed mid-batch and a
broker primary SIGKILLed mid-batch (Sentinel promotes the replica) leave every run answered, none twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import Cluster
from tests.fixtures_redis_cluster import MASTER, SentinelBroker
from tests.fixtures_services import RedisServer
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import batch_under_way
from worker.config import Settings
from worker.names import STEPS_QUEUE, queue_lists

pytestmark = pytest.mark.integration


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


def test_a_sentinel_broker_fails_over_mid_batch_and_every_run_is_answered(
        cluster: Cluster, sentinel_broker: SentinelBroker, stub_control: StubControl, tmp_path: Path) -> None:
    cluster.env["REACTQ_BROKER_URL"] = sentinel_broker.url
    cluster.env["REACTQ_BROKER_SENTINEL_MASTER"] = MASTER
    _, batch, _, out, expected = batch_under_way(cluster, stub_control, tmp_path, 300, 8)
    sentinel_broker.fail_over()
    stderr = cluster.finish_batch(batch, timeout=300)
    assert batch.returncode == 0, stderr[-3000:]
    assert_all_answered(out, expected)
    stats = stub_control.stats()
    assert stats["completions"] <= 2 * len(expected) * 3, stats  # repeated calls stay bounded
