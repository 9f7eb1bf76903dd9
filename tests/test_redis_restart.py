"""A Redis restart in the middle of a batch: workers reconnect and every run still finishes right."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures_cluster import Cluster
from tests.fixtures_services import RedisServer
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import inline_questions

pytestmark = pytest.mark.integration


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis-data")
    server.workdir.mkdir()
    server.start()
    yield server
    server.stop()


def test_redis_restart_mid_batch(own_redis: RedisServer, cluster: Cluster, stub_control: StubControl,
                                 tmp_path: Path) -> None:
    cluster.env["REACTQ_REDIS_URL"] = own_redis.url
    stub_control.set_faults(latency_ms=300)
    cluster.start_worker(queues="steps", concurrency=16)
    infile, expected = inline_questions(tmp_path, repeat=2)
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    cluster.wait_for_results(out, 3)
    own_redis.stop()  # SIGTERM: Redis writes its AOF and exits
    time.sleep(2)
    own_redis.start()  # same port, same data directory
    stderr = cluster.finish_batch(batch)
    assert batch.returncode == 0, stderr[-3000:]
    assert_all_answered(out, expected)


def test_redis_killed_mid_batch(own_redis: RedisServer, cluster: Cluster, stub_control: StubControl,
                                tmp_path: Path) -> None:
    """SIGKILL, not a clean shutdown: up to a second of AOF writes may be lost. Every run still ends up
    answered — in this invocation, or (if its record was lost) by re-running the same command."""
    cluster.env["REACTQ_REDIS_URL"] = own_redis.url
    stub_control.set_faults(latency_ms=300)
    cluster.start_worker(queues="steps", concurrency=16)
    infile, expected = inline_questions(tmp_path, repeat=2)
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    cluster.wait_for_results(out, 3)
    assert own_redis.proc is not None
    own_redis.proc.kill()
    own_redis.proc.wait(10)
    time.sleep(1)
    own_redis.start()
    stderr = cluster.finish_batch(batch)
    assert batch.returncode in (0, 1), stderr[-3000:]
    if batch.returncode == 1:
        assert "vanished from Redis" in stderr
        assert cluster.reactq("batch", str(infile), "--out", str(out)).returncode == 0
    assert_all_answered(out, expected)
