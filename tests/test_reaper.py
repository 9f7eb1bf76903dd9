"""The reaper, driven directly: which stranded runs it re-enqueues (and why), with real Celery messages
waiting in a busy queue on a real Redis. Time is moved by passing `now`; nothing sleeps."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from tests.store_helpers import lease_held
from tests.waiting import wait_for
from worker import metrics
from worker.config import Settings
from worker.core.models import Run, RunSpec, RunStatus
from worker.names import PRIORITY_STEPS
from worker.runtime.context import Runtime
from worker.runtime.reaper import ReaperAction, reap_once
from worker.runtime.runner import Dispatcher
from worker.service.submit import new_run
from worker.store import keys
from worker.tasks.app import STEP_TASK, STEPS_QUEUE
from worker.tasks.webhooks import send_delivery

STALE_S, LEASE_S, SANDBOX_S = 30.0, 2.0, 60


@pytest.fixture
def rt(redis_url: str) -> Runtime:
    redis.Redis.from_url(redis_url).flushdb()
    return Runtime(Settings(redis_url=redis_url, stale_after_s=STALE_S, lease_ttl_s=LEASE_S,
                            sandbox_redispatch_after_s=SANDBOX_S, reaper_interval_s=1))


@pytest.fixture
def broker(redis_url: str) -> Iterator[Celery]:
    """A producer of real step messages, configured like the workers' app (priority lists)."""
    app = Celery("reaper-test", broker=redis_url)
    app.conf.broker_transport_options = {"priority_steps": PRIORITY_STEPS}
    yield app
    app.close()


def submit(rt: Runtime, count: int = 1) -> list[Run]:
    runs = [new_run(RunSpec(question=f"q{i}"), rt.settings) for i in range(count)]
    rt.store.submissions.create_runs(runs)
    return runs


def enqueue(broker: Celery, run: Run, priority: int | None = None) -> None:
    broker.send_task(STEP_TASK, args=[run.id, run.current_step], queue=STEPS_QUEUE, priority=priority)


def reap(rt: Runtime, at: float) -> dict[str, int]:
    rt.redis.delete(keys.REAPER_LOCK)  # each call is its own pass
    kicked: dict[str, int] = {}
    reap_once(rt, Dispatcher(next_step=lambda run_id, index: kicked.__setitem__(run_id, index),
                              sandbox=lambda request: None, webhook=send_delivery), now=at)
    return kicked


def count(action: ReaperAction) -> float:
    return metrics.REAPER_ACTIONS.labels(action)._value.get()


def test_a_lost_message_is_re_enqueued_while_the_queue_is_busy(rt: Runtime, broker: Celery) -> None:
    lost, *waiting = submit(rt, 60)
    for i, run in enumerate(waiting):  # a backlog over every priority list
        enqueue(broker, run, priority=i % 10)
    before = count(ReaperAction.LOST_MESSAGE)
    assert reap(rt, time.time() + STALE_S - 5) == {}  # not idle long enough yet
    assert reap(rt, time.time() + STALE_S + 1) == {}  # missing once: maybe a worker is just taking it
    assert reap(rt, time.time() + STALE_S + 2) == {lost.id: 0}  # missing twice in a row
    assert count(ReaperAction.LOST_MESSAGE) == before + 1


def test_a_dead_workers_step_is_re_enqueued_once_its_lease_lapses(rt: Runtime, broker: Celery) -> None:
    dead, alive, *backlog = submit(rt, 30)
    for run in backlog:
        enqueue(broker, run)
    # Two workers received their steps; one keeps renewing its lease, the other died (lease lapses).
    assert rt.leases.store.lease_and_load(dead.id, 0, "dead-token", 200).acquired
    assert rt.leases.store.lease_and_load(alive.id, 0, "alive-token", 60_000).acquired
    wait_for("the dead worker's lease to lapse", lambda: not lease_held(rt.store, dead.id), 10)
    before = count(ReaperAction.DEAD_WORKER)
    assert reap(rt, time.time() + LEASE_S) == {}  # a lease only just lapsed may be a slow renewal
    assert reap(rt, time.time() + 2 * LEASE_S + 1) == {dead.id: 0}  # well before STALE_S
    assert count(ReaperAction.DEAD_WORKER) == before + 1


def test_a_run_waiting_on_a_sandbox_task_that_vanished_is_re_kicked(rt: Runtime) -> None:
    [run] = submit(rt)
    snapshot = rt.leases.store.lease_and_load(run.id, 0, "token", 10_000).snapshot  # a step dispatches its python call,
    assert snapshot is not None and rt.store.mark_running(snapshot, 0, waiting_on="sandbox") is not None
    rt.leases.store.release(run.id, "token")  # waits, and lets go of the run
    before = count(ReaperAction.SANDBOX_LOST)
    assert reap(rt, time.time() + SANDBOX_S - 5) == {}  # the sandbox may still be working on it
    assert reap(rt, time.time() + SANDBOX_S + 1) == {run.id: 0}
    assert count(ReaperAction.SANDBOX_LOST) == before + 1


def wait_on_sandbox(rt: Runtime) -> Run:
    """A run whose step dispatched its python call and let go of the run, waiting for the result."""
    [run] = submit(rt)
    snapshot = rt.leases.store.lease_and_load(run.id, 0, "token", 10_000).snapshot
    assert snapshot is not None and rt.store.mark_running(snapshot, 0, waiting_on="sandbox") is not None
    rt.leases.store.release(run.id, "token")
    waiting = rt.store.load_run(run.id)
    assert waiting is not None and waiting.deadline_at is not None
    return waiting


def test_a_call_still_waiting_in_line_is_not_re_sent(rt: Runtime) -> None:
    run = wait_on_sandbox(rt)
    rt.redis.set(keys.sandbox_pending(run.id, 0), "1", ex=60)  # its sandbox task polls for a slot
    before = count(ReaperAction.SANDBOX_LOST)
    assert reap(rt, time.time() + SANDBOX_S + 1) == {}
    assert reap(rt, time.time() + 10 * SANDBOX_S) == {}  # however long it waits
    assert count(ReaperAction.SANDBOX_LOST) == before
    rt.redis.delete(keys.sandbox_pending(run.id, 0))  # the task vanished: its marker expired
    assert reap(rt, time.time() + SANDBOX_S + 1) == {run.id: 0}
    assert count(ReaperAction.SANDBOX_LOST) == before + 1


def test_a_sandbox_results_continuation_waiting_its_turn_behind_a_backlog_is_left_alone(
        rt: Runtime, broker: Celery) -> None:
    """The result is stored and the marker gone; the continuation waits in the steps queue at the run's
    priority (worker/tasks/steps.py): it will run, so nothing is re-sent, however long the backlog."""
    run = wait_on_sandbox(rt)
    for other in submit(rt, 20):
        enqueue(broker, other, priority=2)
    enqueue(broker, run, priority=9)
    before = count(ReaperAction.SANDBOX_LOST)
    for later in (SANDBOX_S - 5, SANDBOX_S + 1, SANDBOX_S + 2, 10 * SANDBOX_S):
        assert reap(rt, time.time() + later) == {}
    assert count(ReaperAction.SANDBOX_LOST) == before


def test_a_lost_sandbox_call_past_the_runs_deadline_ends_the_run(rt: Runtime) -> None:
    run = wait_on_sandbox(rt)
    assert run.deadline_at is not None
    rt.redis.set(keys.sandbox_pending(run.id, 0), "1", ex=60)
    before = count(ReaperAction.SANDBOX_DEADLINE)
    assert reap(rt, run.deadline_at + 1) == {}  # the waiting task itself will store the deadline's result
    assert rt.store.load_run(run.id).status == RunStatus.RUNNING  # type: ignore[union-attr]
    rt.redis.delete(keys.sandbox_pending(run.id, 0))
    assert reap(rt, run.deadline_at + 1) == {}  # not re-sent: ended
    ended = rt.store.load_run(run.id)
    assert ended is not None and ended.status == RunStatus.TIMEOUT
    assert ended.error == "run deadline passed while waiting for a sandbox result (no sandbox task was answering)"
    assert count(ReaperAction.SANDBOX_DEADLINE) == before + 1


def take_unacked(client: redis.Redis, tag: str, taken_at: float) -> None:
    """What kombu does as a worker takes a message: off its list, into `unacked` and its index."""
    [lst] = [name for name in client.keys(f"{STEPS_QUEUE}*") if client.type(name) == b"list"]
    raw = client.rpop(lst)
    client.hset(keys.CELERY_UNACKED, tag, b"[" + raw + b', "", "reactq.steps"]')
    client.zadd(keys.CELERY_UNACKED_INDEX, {tag: taken_at})


def test_a_message_held_unacked_by_a_live_worker_is_not_duplicated(rt: Runtime, redis_url: str,
                                                                    broker: Celery) -> None:
    [run] = submit(rt)
    # A worker took it but has not started it: a countdown (a busy retry, a throttled step) not yet due.
    broker.send_task(STEP_TASK, args=[run.id, 0], queue=STEPS_QUEUE, countdown=STALE_S + 60)
    take_unacked(redis.Redis.from_url(redis_url), "tag-1", time.time())
    assert reap(rt, time.time() + STALE_S + 1) == {}
    assert reap(rt, time.time() + STALE_S + 2) == {}


def test_a_message_taken_but_never_started_is_re_kicked(rt: Runtime, redis_url: str, broker: Celery) -> None:
    """A worker's connection broke while it took the message (Redis restarted): it sits in `unacked`,
    which kombu restores only after its visibility timeout (an hour), and no worker has the step."""
    [run] = submit(rt)
    enqueue(broker, run)
    now = time.time()
    take_unacked(redis.Redis.from_url(redis_url), "tag-1", taken_at=now + 10)
    before = count(ReaperAction.LOST_MESSAGE)
    for late in (1, 2, 9):  # the run is stale, but the message was taken lately: a worker may start it
        assert reap(rt, now + STALE_S + late) == {}
    assert reap(rt, now + STALE_S + 11) == {}  # no longer held: the first miss makes the run a suspect
    assert reap(rt, now + STALE_S + 12) == {run.id: 0}
    assert count(ReaperAction.LOST_MESSAGE) == before + 1


def test_runs_whose_record_vanished_leave_the_active_set(rt: Runtime) -> None:
    [run] = submit(rt)
    rt.redis.delete(keys.run(run.id))  # expired, or lost with the last second of Redis writes
    before = count(ReaperAction.DROPPED)
    assert reap(rt, time.time() + STALE_S + 1) == {}
    assert rt.cluster.active_count() == 0 and count(ReaperAction.DROPPED) == before + 1
