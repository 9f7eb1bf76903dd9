"""A Redis restart in the middle of a batch: workers reconnect and every run still finishes right."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fixtures_cluster import Cluster
from tests.fixtures_services import RedisServer
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import batch_under_way
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
BROKER_LOST = "Connection to broker lost"  # what Celery's consumer logs when Redis goes away under it


def wait_until_lost(cluster: Cluster, worker: subprocess.Popen[bytes]) -> None:
    """Until the worker has found Redis gone (and started reconnecting), so that Redis comes back to a
    worker that must recover, not between two of its reads."""
    wait_for("the worker to lose its Redis connection", lambda: cluster.log(worker), 30,
             until=lambda log: BROKER_LOST in log, show=lambda log: log.splitlines()[-1:])


def test_redis_restart_mid_batch(own_redis: RedisServer, cluster: Cluster, stub_control: StubControl,
                                 tmp_path: Path) -> None:
    cluster.env["REACTQ_REDIS_URL"] = own_redis.url
    worker, batch, _, out, expected = batch_under_way(cluster, stub_control, tmp_path, 300, 16)
    own_redis.stop()  # SIGTERM: Redis writes its AOF and exits
    wait_until_lost(cluster, worker)
    own_redis.start()  # same port, same data directory
    stderr = cluster.finish_batch(batch)
    assert batch.returncode == 0, stderr[-3000:]
    assert_all_answered(out, expected)


def test_redis_killed_mid_batch(own_redis: RedisServer, cluster: Cluster, stub_control: StubControl,
                                tmp_path: Path) -> None:
    """SIGKILL, not a clean shutdown: up to a second of AOF writes may be lost. Every run still ends up
    answered — in this invocation, or (if its record was lost) by re-running the same command."""
    cluster.env["REACTQ_REDIS_URL"] = own_redis.url
    worker, batch, infile, out, expected = batch_under_way(cluster, stub_control, tmp_path, 300, 16)
    assert own_redis.proc is not None
    own_redis.proc.kill()
    own_redis.proc.wait(10)
    wait_until_lost(cluster, worker)
    own_redis.start()
    stderr = cluster.finish_batch(batch)
    assert batch.returncode in (0, 1), stderr[-3000:]
    if batch.returncode == 1:
        assert "vanished from Redis" in stderr
        assert cluster.reactq("batch", str(infile), "--out", str(out)).returncode == 0
    assert_all_answered(out, expected)
