"""Run state on a real Redis Cluster (REACTQ_REDIS_URL=redis+cluster://), the broker on a Redis of its own.

Six redis-server processes make three primaries with a replica each; the broker is a Sentinel-managed
primary with one replica and three sentinels. A batch runs through real workers while a cluster primary is
SIGKILLed, then the broker's primary: every run is answered right, once, and the model calls repeated stay
bounded. Every key of a run is on its run's shard; nothing of a run is left in its outbox.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures_cluster import Cluster, state_client
from tests.fixtures_redis_cluster import RedisClusterNodes
from tests.fixtures_services import RedisServer
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import batch_under_way
from worker.store import keys
from worker.store.outbox import slot_of

pytestmark = pytest.mark.integration


def test_a_batch_runs_on_a_redis_cluster(cluster: Cluster, redis_cluster: RedisClusterNodes, own_redis: RedisServer,
                                         stub_control: StubControl, tmp_path: Path) -> None:
    cluster.env["REACTQ_REDIS_URL"] = redis_cluster.url
    cluster.env["REACTQ_BROKER_URL"] = own_redis.url
    _, batch, _, out, expected = batch_under_way(cluster, stub_control, tmp_path, 50, 8)
    stderr = cluster.finish_batch(batch)
    assert batch.returncode == 0, stderr[-3000:]
    lines = assert_all_answered(out, expected)
    state = state_client(redis_cluster.url)
    for line in lines.values():
        run_id = line["run_id"]
        run_keys = list(state.scan_iter(f"reactq:run:{{{run_id}}}*"))
        assert run_keys and {slot_of(k) for k in run_keys} == {slot_of(keys.run(run_id))}
        assert not state.exists(keys.outbox(run_id))
    assert state.zcard(keys.ACTIVE_RUNS) == 0
