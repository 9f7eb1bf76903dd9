"""Per-tenant quotas against a real redis-server (shared by all workers): concurrency and the per-minute
rate make a call wait in line (`Wait`, with the same ticket polling again), only the CPU day refuses."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tools_sandbox import SandboxService, SandboxSettings, load_tiers
from tools_sandbox.base.quotas import SLOT_GRACE_S, QuotaGate, Rejection, Slot, Wait

pytestmark = pytest.mark.integration
NOW = 1_700_000_050.0  # 10 s into a minute


@pytest.fixture
def gate(redis_url: str):
    g = QuotaGate(redis_url)
    g.start()
    yield g
    g.close()


@pytest.fixture
def tiers(test_tiers_file: Path):
    return load_tiers(test_tiers_file)


def test_concurrency_limit_and_release(gate: QuotaGate, tiers) -> None:
    tier = tiers["roomy"]  # 1 concurrent
    slot = gate.acquire(tier, "acme", ticket="a", now=NOW)
    assert isinstance(slot, Slot) and slot.slot_id == "a"
    waits = gate.acquire(tier, "acme", ticket="b", arrival=NOW + 1, now=NOW + 1)
    assert isinstance(waits, Wait) and waits.quota == "concurrent_executions" and waits.position == 0
    assert 0 < waits.retry_in_s <= tier.wall_time_s + SLOT_GRACE_S
    assert gate.waiting("roomy", "acme") == ["b"]
    # Another tenant is not affected.
    assert isinstance(gate.acquire(tier, "other", now=NOW + 1), Slot)
    # The slot's own ticket again (a duplicate of the executing call) is told it is in progress.
    again = gate.acquire(tier, "acme", ticket="a", now=NOW + 1)
    assert isinstance(again, Wait) and again.quota == "in_progress"
    gate.release(slot, 0.1, now=NOW + 2)
    late = gate.acquire(tier, "acme", ticket="c", arrival=NOW + 2, now=NOW + 2)
    assert isinstance(late, Wait) and late.position == 1  # behind b, who came first
    assert isinstance(gate.acquire(tier, "acme", ticket="b", arrival=NOW + 1, now=NOW + 2), Slot)
    assert gate.waiting("roomy", "acme") == ["c"]


def test_slot_of_a_crashed_worker_expires(gate: QuotaGate, tiers) -> None:
    tier = tiers["roomy"]
    assert isinstance(gate.acquire(tier, "acme", now=NOW), Slot)  # never released: the worker died
    assert isinstance(gate.acquire(tier, "acme", ticket="b", now=NOW + 5), Wait)
    later = NOW + tier.wall_time_s + SLOT_GRACE_S + 1
    assert isinstance(gate.acquire(tier, "acme", ticket="b", arrival=NOW + 5, now=later), Slot)


def test_executions_per_minute_make_the_call_wait(gate: QuotaGate, tiers) -> None:
    tier = tiers["roomy"]  # 3 per minute
    for i in range(3):
        slot = gate.acquire(tier, "acme", now=NOW + i)
        assert isinstance(slot, Slot)
        gate.release(slot, 0.0, now=NOW + i)
    waits = gate.acquire(tier, "acme", ticket="d", arrival=NOW + 4, now=NOW + 4)
    assert isinstance(waits, Wait) and waits.quota == "executions_per_minute"
    assert waits.retry_in_s == 46
    assert isinstance(gate.acquire(tier, "acme", ticket="d", arrival=NOW + 4, now=NOW + 60), Slot)


def test_cpu_seconds_per_day(gate: QuotaGate, tiers) -> None:
    tier = tiers["roomy"]  # 5 cpu-seconds a day
    slot = gate.acquire(tier, "acme", now=NOW)
    assert isinstance(slot, Slot)
    gate.release(slot, 5.5, now=NOW)
    refused = gate.acquire(tier, "acme", now=NOW + 1)
    assert isinstance(refused, Rejection) and refused.quota == "cpu_seconds_per_day"
    assert 0 < refused.resets_in_s <= 86400
    assert isinstance(gate.acquire(tier, "acme", now=NOW + 86400), Slot)


def test_concurrency_is_atomic_across_workers(redis_url: str, tiers) -> None:
    tier = tiers["tiny"]  # 2 concurrent
    gates = [QuotaGate(redis_url) for _ in range(4)]
    for g in gates:
        g.start()
    results: list[object] = []
    barrier = threading.Barrier(20)

    def grab(g: QuotaGate) -> None:
        barrier.wait()
        results.append(g.acquire(tier, "acme"))

    threads = [threading.Thread(target=grab, args=(gates[i % 4],)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g in gates:
        g.close()
    assert sum(isinstance(r, Slot) for r in results) == 2


def test_service_waits_in_line_then_gives_up_at_its_deadline(redis_url: str,
                                                             sandbox_settings: SandboxSettings) -> None:
    def rejections() -> float:
        return REGISTRY.get_sample_value(
            "reactq_quota_rejections_total", {"tier": "roomy", "quota": "executions_per_minute"}) or 0.0

    before = rejections()
    # The quota counts per wall-clock minute: four calls straddling a minute's end would all fit.
    if time.time() % 60 > 40:
        time.sleep(60.5 - time.time() % 60)
    with SandboxService(sandbox_settings, backend="process", redis_url=redis_url) as service:
        outs = [service.execute("print(1)", tier="roomy", tenant="acme", wait_s=0) for _ in range(4)]
        other = service.execute("print(2)", tier="roomy", tenant="globex")
        assert service.quotas is not None and service.quotas.waiting("roomy", "acme") == []  # it left the line
    assert [o.error for o in outs[:3]] == [None, None, None]
    assert outs[3].error == ("quota_exceeded: the run's deadline passed while waiting for a sandbox slot "
                             "(executions_per_minute for tenant acme on tier roomy); the code did not run")
    assert outs[3].exit_code is None and outs[3].outcome == "quota_exceeded"
    assert other.error is None and other.stdout == "2\n"
    assert rejections() == before + 1
    # Known label sets exist from the start.
    assert REGISTRY.get_sample_value(
        "reactq_sandbox_executions_total", {"tier": "tiny", "outcome": "oom"}) is not None
