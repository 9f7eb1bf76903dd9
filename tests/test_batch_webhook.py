"""A batch's figures at constant cost, and its one webhook when its last runs end together: the
statuses come from counters kept in the transaction that records each run's end (not from reading every
run), the one-time marker is claimed before any view is built, and the webhook body carries counts and a
route to page through the runs instead of every run id. Real redis-server; runs are ended through the
store's own transaction (no workers needed)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from worker.config import Settings
from worker.core.models import RunSpec, RunStatus
from worker.runtime.context import Runtime
from worker.runtime.finish_hooks import queue_batch_webhook
from worker.service.submit import new_batch_id, submit
from worker.store import keys
from worker.store.batch_view import batch_view


@pytest.fixture
def rt(redis_url: str) -> Iterator[Runtime]:
    runtime = Runtime(Settings(redis_url=redis_url, tenants=["default"]))
    yield runtime
    runtime.redis.close()


def make_batch(rt: Runtime, n: int, url: str | None = "http://hooks.example.com/batch") -> tuple[str, list[str]]:
    batch_id = new_batch_id()
    meta = {"tenant": "default", "submitting": "1", **({"webhook_url": url} if url else {})}
    rt.store.batches.create(batch_id, meta)
    runs = submit(rt.store, [RunSpec(question=f"q{i}") for i in range(n)], rt.settings, lambda *a, **k: None,
                  batch_id=batch_id, tenants=rt.tenants, budgets=rt.budgets)
    rt.store.batches.mark_submitted(batch_id, n)
    return batch_id, [r.id for r in runs]


def end_all(rt: Runtime, run_ids: list[str]) -> None:
    for i, run_id in enumerate(run_ids):
        status = RunStatus.CANCELLED if i % 10 == 0 else RunStatus.SUCCEEDED
        assert rt.store.finish(run_id, status, "" if status == RunStatus.SUCCEEDED else "cancelled") is not None


def test_statuses_are_counted_as_runs_end_not_read_from_every_run(rt: Runtime) -> None:
    batch_id, run_ids = make_batch(rt, 40)
    end_all(rt, run_ids[:25])
    view = batch_view(rt.store, batch_id)
    assert view is not None
    assert (view["size"], view["finished"], view["unfinished"]) == (40, 25, 15)
    assert view["statuses"] == {"cancelled": 3, "succeeded": 22}
    assert view["runs_url"] == f"/v1/runs?batch_id={batch_id}" and "run_ids" not in view

    end_all(rt, run_ids[25:])
    rt.store.finish(run_ids[1], RunStatus.FAILED, "again")  # an end recorded twice is counted once
    rt.redis.delete(*[keys.run(r) for r in run_ids])  # the view does not need the run records at all
    view = batch_view(rt.store, batch_id)
    assert view is not None and view["statuses"] == {"cancelled": 5, "succeeded": 35} and view["unfinished"] == 0


def test_a_batch_from_before_the_counters_has_its_runs_read(rt: Runtime) -> None:
    batch_id, run_ids = make_batch(rt, 12)
    end_all(rt, run_ids[:5])
    rt.redis.hdel(keys.batch(batch_id), keys.BATCH_COUNTS_STATUSES, "status:succeeded", "status:cancelled")
    view = batch_view(rt.store, batch_id)
    assert view is not None and view["statuses"] == {"cancelled": 1, "queued": 7, "succeeded": 4}


def test_the_last_runs_ending_together_queue_one_webhook_without_run_ids(rt: Runtime) -> None:
    batch_id, run_ids = make_batch(rt, 60)
    end_all(rt, run_ids)
    sent: list[tuple[str, int, float]] = []
    queued: list[bool] = []
    start = threading.Barrier(16)

    def last_run_ends() -> None:
        start.wait()
        queued.append(queue_batch_webhook(rt, batch_id, "default", lambda *a: sent.append(a)))

    threads = [threading.Thread(target=last_run_ends) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert queued.count(True) == 1 and len(sent) == 1
    [delivery] = rt.webhooks.list("default")
    body = json.loads(delivery.body)
    assert delivery.event == "batch.finished" and delivery.subject_id == batch_id
    assert body == batch_view(rt.store, batch_id) and "run_ids" not in body
    assert body["statuses"] == {"cancelled": 6, "succeeded": 54} and body["finished"] == 60


def test_no_webhook_while_the_batch_is_still_being_submitted(rt: Runtime) -> None:
    batch_id, run_ids = make_batch(rt, 3)
    rt.redis.hset(keys.batch(batch_id), "submitting", "1")
    end_all(rt, run_ids)
    sent: list[tuple[str, int, float]] = []
    assert not queue_batch_webhook(rt, batch_id, "default", lambda *a: sent.append(a))
    rt.store.batches.mark_submitted(batch_id, 3)
    assert queue_batch_webhook(rt, batch_id, "default", lambda *a: sent.append(a)) and len(sent) == 1
    assert not queue_batch_webhook(rt, batch_id, "default", lambda *a: sent.append(a))  # once
