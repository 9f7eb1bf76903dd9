"""Admission at submit(), in process on the real Redis: a tenant's runs in flight and submissions per minute
are checked by the same script that records the runs (worker/store/submissions.py, `create_runs`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_api import SHIPPED_PLANS, TINY_PLAN
from tests.harness import Harness
from worker.core.models import Run, RunSpec
from worker.errors import AdmissionRefused, QuotaExceeded
from worker.service.submit import new_run, submit
from worker.store import keys
from worker.store.submissions import Quota


@pytest.fixture
def small(make_harness: Any, tmp_path: Path) -> Harness:
    """A harness whose tenant `small` is on plan `tiny`: 2 runs in flight, 4 submissions a minute."""
    plans = tmp_path / "plans.toml"
    plans.write_text(SHIPPED_PLANS + TINY_PLAN)
    harness = make_harness(plans_file=str(plans))
    harness.rt.tenants.add("small", "tiny")
    return harness


def submit_one(harness: Harness, question: str = "What is 2 + 2?") -> str:
    [run] = submit(harness.store, [RunSpec(question=question, tenant=small_id(harness))], harness.rt.settings,
                   harness.dispatch.next_step, tenants=harness.rt.fresh_tenants(), budgets=harness.rt.budgets)
    return run.id


def small_id(harness: Harness) -> str:
    """The id `small`'s runs are stored under (a tenant added now has an id of its own)."""
    return harness.rt.tenants.resolve("small")


def run_keys(harness: Harness) -> set[bytes]:
    return set(harness.store.r.scan_iter(keys.run("*")))


def test_a_submission_past_the_runs_in_flight_writes_nothing(small: Harness) -> None:
    first = [submit_one(small) for _ in range(2)]
    before = run_keys(small)
    with pytest.raises(AdmissionRefused, match="2 runs in flight") as refused:
        submit_one(small)
    assert refused.value.retry_after_s == 5
    assert run_keys(small) == before and len(small.dispatch.sent_steps) == 2
    assert small.store.r.smembers(keys.tenant_inflight(small_id(small))) == {i.encode() for i in first}


def test_a_run_whose_record_expired_gives_its_slot_back(small: Harness) -> None:
    gone, kept = submit_one(small), submit_one(small)
    small.store.r.delete(keys.run(gone))  # expired without ever finishing
    admitted = submit_one(small)
    assert small.store.r.smembers(keys.tenant_inflight(small_id(small))) == {kept.encode(), admitted.encode()}


def test_the_fifth_submission_in_a_minute_is_refused(small: Harness) -> None:
    quota = Quota("small", 1, in_flight=100, per_minute=4)
    minute = (time.time() // 60) * 60  # the five submissions below fall in one minute: its first second
    for _ in range(4):
        small.store.submissions.create_runs([small_run(small)], quotas=[quota], now=minute)
    with pytest.raises(QuotaExceeded) as exceeded:
        small.store.submissions.create_runs([small_run(small)], quotas=[quota], now=minute + 59)
    assert (exceeded.value.limit, exceeded.value.quota) == ("per_minute", quota)
    small.store.submissions.create_runs([small_run(small)], quotas=[quota], now=minute + 60)  # the next minute


def small_run(harness: Harness) -> Run:
    return new_run(RunSpec(question="q", tenant=small_id(harness)), harness.rt.settings)


def test_a_minutes_submission_counter_gets_its_expiry_when_it_is_made(small: Harness) -> None:
    quota = Quota("small", 1, in_flight=100, per_minute=4)
    minute = (time.time() // 60) * 60
    counter = keys.tenant_submissions(quota.tenant, int(minute // 60))
    small.store.submissions.create_runs([small_run(small)], quotas=[quota], now=minute)
    assert 60 < small.store.r.ttl(counter) <= 120
    small.store.r.expire(counter, 50)
    small.store.submissions.create_runs([small_run(small)], quotas=[quota], now=minute + 1)
    assert small.store.r.get(counter) == b"2" and 0 < small.store.r.ttl(counter) <= 50
