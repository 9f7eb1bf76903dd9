"""The cap on requests in flight to a model's server (REACTQ_MODELS' max_in_flight), over every worker: the slots
on a real redis-server, and a real worker pool that never sends the stub more requests at once than the cap,
its other steps going back to the queue, every run answered."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import Cluster
from tests.fixtures_stub import StubControl
from tests.store_helpers import slots_held
from worker.errors import LLMThrottled
from worker.llm.in_flight import InFlightCap
from worker.store.llm_slots import LLMSlots


@pytest.fixture
def slots(redis_url: str) -> Iterator[LLMSlots]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield LLMSlots(client)
    client.close()


def test_a_model_at_its_cap_sends_nothing_more_until_a_slot_is_given_back(slots: LLMSlots) -> None:
    cap = InFlightCap(slots, {"m": 2}, hold_s=30)
    with cap.slot("m"), cap.slot("m"):
        with pytest.raises(LLMThrottled) as throttled, cap.slot("m"):
            pass
        assert throttled.value.wait_s > 0 and slots_held(slots, "m") == 2
        with cap.slot("other"):  # no cap: not counted
            assert slots_held(slots, "other") == 0
    assert slots_held(slots, "m") == 0
    with cap.slot("m"):
        assert slots_held(slots, "m") == 1


def test_a_hold_lapses_unless_renewed_so_a_dead_workers_slot_comes_back(slots: LLMSlots) -> None:
    assert slots.take("m", "dead", 1, hold_ms=300) and slots.take("m", "alive", 2, hold_ms=300)
    assert not slots.take("m", "third", 2, hold_ms=300)
    for _ in range(4):
        time.sleep(0.15)
        assert slots.renew("m", "alive", 300)
    assert slots_held(slots, "m") == 1 and slots.take("m", "third", 2, hold_ms=300)  # the dead one's lapsed
    assert not slots.renew("m", "never-taken", 300)


@pytest.mark.integration
def test_a_worker_pool_sends_the_server_no_more_than_its_slots(cluster: Cluster, stub_control: StubControl,
                                                               tmp_path: Path) -> None:
    stub_control.set_faults(chunk_delay_ms=100)  # each answer takes a while: calls would overlap without the cap
    cluster.start_worker(queues="steps", concurrency=8,
                         REACTQ_MODELS=json.dumps({"reactq-stub": {"max_in_flight": 2}}))
    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    infile.write_text("".join(json.dumps({"id": str(i), "question": f"What is {i} * 7?"}) + "\n" for i in range(2, 10)))
    done = cluster.reactq("batch", str(infile), "--out", str(out))
    assert done.returncode == 0, done.stderr
    answers = {r["id"]: r.get("answer") for r in map(json.loads, out.read_text().splitlines())}
    assert answers == {str(i): str(i * 7) for i in range(2, 10)}
    stats = stub_control.stats()
    assert stats["peak_in_flight"] == 2, stats  # the cap was reached, and never passed
