"""No sandbox call is ever dropped: a call over its tenant's concurrency or per-minute quota waits
in line, first come first served, up to its run's deadline; only the CPU day refuses. Against a real
redis-server (time moved by passing `now`), the real task run eagerly, and real Celery sandbox workers."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from tests.fixtures_cluster import Cluster
from tests.fixtures_sandbox import TEST_TIERS, tier_toml
from tests.harness import Harness, call, final
from tests.waiting import wait_for
from tools_sandbox import SandboxResult, load_tiers, render_result
from tools_sandbox.base import keys as sandbox_keys
from tools_sandbox.base.quotas import QuotaGate, Rejection, Slot, Wait
from tools_sandbox.base.render import UNAVAILABLE_TEXT
from tools_sandbox.edges import sandbox_worker
from worker import metrics
from worker.core.outcome import Outcome
from worker.names import SANDBOX_TASK
from worker.runtime.reaper import ReaperAction, reap_once
from worker.store import keys as worker_keys

pytestmark = pytest.mark.integration
NOW = 1_700_000_050.0  # 10 s into a minute
# `lane`: one execution at a time, 10 s each at most; `paced`: two a minute, 3 CPU-seconds a day.
LANE = {"wall_time_s": 10, "cpu_time_s": 5}
WAIT_TIERS = tier_toml("lane", (1, 1000, 1000), **LANE) + tier_toml("paced", (5, 2, 3))
CONTINUE = "reactq.test.continue"


@pytest.fixture(scope="module")
def wait_tiers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("waits") / "tiers.toml"
    path.write_text(TEST_TIERS + WAIT_TIERS, encoding="utf-8")
    return path


@pytest.fixture
def gate(redis_url: str) -> Iterator[QuotaGate]:
    g = QuotaGate(redis_url, waiter_stale_s=300)  # nobody goes stale in these tests unless asked to
    g.start()
    yield g
    g.close()


def poll(gate: QuotaGate, tier: Any, ticket: str, arrival: float, now: float) -> Slot | Wait | Rejection:
    return gate.acquire(tier, "acme", ticket=ticket, arrival=arrival, now=now)


# --- the line, with time injected ---------------------------------------------------------------------------

def test_the_concurrency_line_is_first_come_first_served(gate: QuotaGate, wait_tiers: Path) -> None:
    lane = load_tiers(wait_tiers)["lane"]  # 1 concurrent
    running = poll(gate, lane, "a", NOW, NOW)
    assert isinstance(running, Slot)
    for i, ticket in enumerate("bcd", start=1):
        assert isinstance(poll(gate, lane, ticket, NOW + i, NOW + i), Wait)
    assert gate.waiting("lane", "acme") == ["b", "c", "d"]
    gate.release(running, 0.1, now=NOW + 5)
    # The last comer polls first, then the second: neither may jump the line while b is in it.
    assert (d := poll(gate, lane, "d", NOW + 3, NOW + 6)) == Wait("concurrent_executions", "acme", "lane", 2, 1.0)
    assert isinstance(c := poll(gate, lane, "c", NOW + 2, NOW + 6), Wait) and c.position == 1, (c, d)
    b = poll(gate, lane, "b", NOW + 1, NOW + 6)
    assert isinstance(b, Slot)
    assert isinstance(poll(gate, lane, "d", NOW + 3, NOW + 7), Wait)
    gate.release(b, 0.1, now=NOW + 8)
    assert isinstance(poll(gate, lane, "d", NOW + 3, NOW + 9), Wait)
    assert isinstance(poll(gate, lane, "c", NOW + 2, NOW + 9), Slot)
    assert gate.waiting("lane", "acme") == ["d"]


def test_the_per_minute_quota_delays_in_order_and_never_refuses(gate: QuotaGate, wait_tiers: Path) -> None:
    paced = load_tiers(wait_tiers)["paced"]  # 5 concurrent, 2 a minute
    for ticket in "ab":
        slot = poll(gate, paced, ticket, NOW, NOW)
        assert isinstance(slot, Slot)
        gate.release(slot, 0.0, now=NOW)
    waits = [poll(gate, paced, t, NOW + i, NOW + i) for i, t in enumerate("cde", start=1)]
    assert [(w.quota, w.position) for w in waits if isinstance(w, Wait)] == [
        ("executions_per_minute", 0), ("executions_per_minute", 1), ("executions_per_minute", 2)]
    assert waits[0].retry_in_s == 49  # the minute turns 50 s after NOW
    assert isinstance(poll(gate, paced, "e", NOW + 3, NOW + 49), Wait)  # still this minute
    # The next minute has 2 executions: they go to c and d, whoever polls first.
    assert isinstance(poll(gate, paced, "e", NOW + 3, NOW + 51), Wait)
    assert isinstance(poll(gate, paced, "d", NOW + 2, NOW + 51), Slot)
    assert isinstance(poll(gate, paced, "c", NOW + 1, NOW + 52), Slot)
    e = poll(gate, paced, "e", NOW + 3, NOW + 53)
    assert isinstance(e, Wait) and (e.quota, e.position) == ("executions_per_minute", 0)
    assert isinstance(poll(gate, paced, "e", NOW + 3, NOW + 111), Slot)


def test_the_cpu_day_still_refuses_and_leaves_the_line(gate: QuotaGate, wait_tiers: Path) -> None:
    paced = load_tiers(wait_tiers)["paced"]  # 3 cpu-seconds a day
    slot = poll(gate, paced, "a", NOW, NOW)
    assert isinstance(slot, Slot)
    assert isinstance(poll(gate, paced, "b", NOW, NOW), Slot)
    assert isinstance(poll(gate, paced, "c", NOW + 1, NOW + 1), Wait)  # the minute's two are used
    gate.release(slot, 3.5, now=NOW + 2)
    refused = poll(gate, paced, "c", NOW + 1, NOW + 3)
    assert isinstance(refused, Rejection) and refused.quota == "cpu_seconds_per_day"
    assert gate.waiting("paced", "acme") == []


def test_a_waiter_that_stopped_polling_leaves_the_line(redis_url: str, wait_tiers: Path) -> None:
    lane = load_tiers(wait_tiers)["lane"]
    gate = QuotaGate(redis_url, waiter_stale_s=30)
    gate.start()
    try:
        slot = poll(gate, lane, "a", NOW, NOW)
        assert isinstance(slot, Slot)
        assert isinstance(poll(gate, lane, "gone", NOW + 1, NOW + 1), Wait)  # its task then vanished
        assert isinstance(poll(gate, lane, "b", NOW + 2, NOW + 2), Wait)
        gate.release(slot, 0.0, now=NOW + 3)
        assert isinstance(poll(gate, lane, "b", NOW + 2, NOW + 20), Wait)  # "gone" may just be slow
        assert isinstance(poll(gate, lane, "b", NOW + 2, NOW + 32), Slot)
        assert gate.waiting("lane", "acme") == []
    finally:
        gate.close()


def test_a_step_sends_a_call_whose_turn_has_come_and_parks_the_others(gate: QuotaGate, wait_tiers: Path) -> None:
    """QuotaGate.enter, what a step asks before sending: a call within the free capacity is sent and counts as
    woken until it arrives (so the wake sends nobody into its slot); the next one is parked, in line behind it."""
    lane = load_tiers(wait_tiers)["lane"]  # 1 concurrent
    assert gate.enter(lane, "acme", ticket="a", arrival=NOW, request="{a}", deadline=NOW + 600, now=NOW)
    assert not gate.enter(lane, "acme", ticket="b", arrival=NOW + 1, request="{b}", deadline=NOW + 600, now=NOW + 1)
    assert gate.waiting("lane", "acme") == ["a", "b"] and gate.parked("lane", "acme") == [b"{b}"]
    assert gate.wake(lane, "acme", now=NOW + 2) == []  # a's slot is spoken for: b stays parked
    slot = poll(gate, lane, "a", NOW, NOW + 2)  # a arrives
    assert isinstance(slot, Slot)
    assert gate.enter(lane, "acme", ticket="a", arrival=NOW, request="{a}", deadline=NOW + 600, now=NOW + 3)  # a copy
    gate.release(slot, 0.1, now=NOW + 4)
    assert gate.wake(lane, "acme", now=NOW + 4) == [b"{b}"]
    assert isinstance(poll(gate, lane, "b", NOW + 1, NOW + 5), Slot)
    assert gate.waiting("lane", "acme") == [] and gate.parked_lines() == []


def test_a_call_stamped_earlier_but_entering_later_does_not_take_the_slot_promised_ahead(
        gate: QuotaGate, wait_tiers: Path) -> None:
    """Two steps stamp their calls, then enter in the other order: the one that entered first was sent with the
    free slot, so the other waits behind it (ranked by its stamp, it would have been sent too, and the first
    call's delivery would only have parked it)."""
    lane = load_tiers(wait_tiers)["lane"]  # 1 concurrent
    assert gate.enter(lane, "acme", ticket="a", arrival=NOW + 1, request="{a}", deadline=NOW + 600, now=NOW + 2)
    assert not gate.enter(lane, "acme", ticket="b", arrival=NOW, request="{b}", deadline=NOW + 600, now=NOW + 2)
    assert gate.waiting("lane", "acme") == ["a", "b"]
    assert isinstance(poll(gate, lane, "a", NOW + 1, NOW + 3), Slot)


def test_the_step_parks_only_what_it_knows_the_quota_of(redis_url: str, wait_tiers: Path) -> None:
    """SandboxLine: a call of a tier the tiers file lacks, or without a deadline, is sent (its delivery
    decides); one over its tier's concurrency is parked with its request as sent, and its pending marker set."""
    from worker.runtime.sandbox_bridge import SandboxLine

    client = redis.Redis.from_url(redis_url)
    line = SandboxLine(client, str(wait_tiers), 60, on_cluster=False)
    occupy(client, "lane")
    try:
        sent = time.time()
        assert not line.parked(request(1, tier="nosuch", queued_at=sent, deadline_at=sent + 600))
        assert not line.parked(request(2, queued_at=sent))
        assert client.hlen(sandbox_keys.quota_parked("lane", "acme")) == 0
        assert line.parked(request(3, queued_at=sent, deadline_at=sent + 600))
        [parked] = [json.loads(raw) for raw in client.hvals(sandbox_keys.quota_parked("lane", "acme"))]
        assert parked == request(3, queued_at=sent, deadline_at=sent + 600, waits=1)
        assert 50_000 < client.pttl("test:waits:pending:3") <= 60_000
    finally:
        client.close()


# --- the task, run in this process on a real Redis ------------------------------------------------------------

def use_eager_task(redis_url: str, wait_tiers: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The sandbox task, its sandbox worker built afresh on this Redis and the wait tiers (process backend)."""
    from tools_sandbox.edges import tasks

    monkeypatch.setenv("REACTQ_REDIS_URL", redis_url)
    monkeypatch.setenv("REACTQ_SANDBOX_BACKEND", "process")
    monkeypatch.setenv("REACTQ_SANDBOX_TIERS_FILE", str(wait_tiers))
    # No background pump in the test process: the test wakes the line itself (the real-worker tests below
    # run the pump).
    monkeypatch.setattr(sandbox_worker.SandboxWorker, "ensure_pump", lambda self, app: None)
    sandbox_worker.stop()
    return tasks


@pytest.fixture
def celery_producer(redis_url: str) -> Iterator[Celery]:
    """The current app while a task runs eagerly: where a waiting call re-queues itself."""

    app = Celery("sandbox-waits-test", broker=redis_url)
    app.set_current()
    yield app
    sandbox_worker.stop()
    app.close()


@pytest.fixture
def eager_task(redis_url: str, wait_tiers: Path, monkeypatch: pytest.MonkeyPatch, celery_producer: Celery) -> Any:
    return use_eager_task(redis_url, wait_tiers, monkeypatch)


def request(i: int, **extra: Any) -> dict[str, Any]:
    return {"code": f"print({i})", "tier": "lane", "tenant": "acme", "result_key": f"test:waits:{i}",
            "continue_task": "reactq.step", "continue_args": [f"run-{i}", 0], "continue_queue": CONTINUE,
            "pending_key": f"test:waits:pending:{i}", **extra}


def occupy(client: redis.Redis, tier: str, tenant: str = "acme", seconds: float = 600) -> None:
    """A slot held by an execution elsewhere (another worker's)."""
    client.zadd(sandbox_keys.quota_running(tier, tenant), {"elsewhere": time.time() + seconds})


def sandbox_messages(client: redis.Redis) -> list[dict[str, Any]]:
    """The sandbox task messages waiting in the broker (countdown ones included: not consumed here)."""
    return [json.loads(raw) for raw in client.lrange("reactq.sandbox", 0, -1)]


def test_a_waiting_call_is_parked_and_woken_when_its_slot_frees(eager_task: Any, redis_url: str,
                                                               celery_producer: Celery) -> None:
    client = redis.Redis.from_url(redis_url)
    occupy(client, "lane")
    out = eager_task.execute.apply(args=[request(1, deadline_at=time.time() + 600)]).get()
    assert out == {"result_key": "test:waits:1", "outcome": "waiting"}
    assert client.get("test:waits:1") is None and client.llen(CONTINUE) == 0
    assert 0 < client.pttl("test:waits:pending:1") <= 60_000
    assert sandbox_messages(client) == []  # nothing of it waits in the broker ...
    [parked] = [json.loads(raw) for raw in client.hvals(sandbox_keys.quota_parked("lane", "acme"))]
    assert parked["waits"] == 1 and parked["queued_at"] is not None  # ... it is parked, keeping its place
    assert client.zrange(sandbox_keys.quota_line("lane", "acme"), 0, -1) == [b"test:waits:1"]
    assert sandbox_worker.current().wake_line(celery_producer, "lane", "acme") == 0  # no slot free: stays parked
    # The slot frees: the wake sends it again at once (no countdown), and that delivery runs it.
    client.delete(sandbox_keys.quota_running("lane", "acme"))
    assert sandbox_worker.current().wake_line(celery_producer, "lane", "acme") == 1
    assert sandbox_worker.current().wake_line(celery_producer, "lane", "acme") == 0  # woken once only
    [message] = sandbox_messages(client)
    assert message["headers"]["task"] == "reactq.sandbox.execute" and message["headers"]["eta"] is None
    [again], _, _ = json.loads(base64.b64decode(message["body"]))
    assert eager_task.execute.apply(args=[again]).get()["outcome"] == "ok"
    assert SandboxResult.model_validate_json(client.get("test:waits:1")).stdout == "1\n"
    assert client.llen(CONTINUE) == 1
    client.close()


def test_a_parked_call_whose_deadline_passes_is_woken_to_end_with_a_result(eager_task: Any, redis_url: str,
                                                                          celery_producer: Celery) -> None:
    client = redis.Redis.from_url(redis_url)
    occupy(client, "lane")
    assert eager_task.execute.apply(args=[request(6, deadline_at=time.time() + 0.5)]).get()["outcome"] == "waiting"
    time.sleep(0.6)
    assert sandbox_worker.current().wake_line(celery_producer, "lane", "acme") == 1  # past its deadline: woken anyway
    [message] = sandbox_messages(client)
    [again], _, _ = json.loads(base64.b64decode(message["body"]))
    assert eager_task.execute.apply(args=[again]).get()["outcome"] == "quota_exceeded"
    assert client.llen(CONTINUE) == 1
    client.close()


def test_a_call_whose_deadline_passes_in_line_gets_a_clear_result(eager_task: Any, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    occupy(client, "lane")
    out = eager_task.execute.apply(args=[request(2, deadline_at=time.time() - 1)]).get()
    assert out == {"result_key": "test:waits:2", "outcome": "quota_exceeded"}
    stored = SandboxResult.model_validate_json(client.get("test:waits:2"))
    assert stored.error_kind == "quota_exceeded" and stored.exit_code is None
    assert render_result(stored).text == (
        "Error: quota_exceeded: the run's deadline passed while waiting for a sandbox slot "
        "(concurrent_executions for tenant acme on tier lane); the code did not run")
    assert client.llen(CONTINUE) == 1 and sandbox_messages(client) == []
    assert client.zcard(sandbox_keys.quota_line("lane", "acme")) == 0
    client.close()


def test_an_old_message_without_a_deadline_waits_a_bounded_time(eager_task: Any, redis_url: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis.Redis.from_url(redis_url)
    occupy(client, "lane")
    old = {k: v for k, v in request(3).items() if k != "pending_key"}  # what an older sender sent
    assert eager_task.execute.apply(args=[old]).get()["outcome"] == "waiting"
    monkeypatch.setenv("REACTQ_SANDBOX_WAIT_MAX_S", "0")  # the bound from settings, here: none left
    sandbox_worker.stop()
    assert eager_task.execute.apply(args=[old]).get()["outcome"] == "quota_exceeded"
    assert client.llen(CONTINUE) == 1
    client.close()


def test_a_failure_of_ours_is_sent_again_until_the_window_passes(eager_task: Any, redis_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything of ours that breaks is not the call's answer: the call goes back to the queue (its marker kept
    alive) until REACTQ_SANDBOX_UNAVAILABLE_S have passed since it first failed; then its result is
    `unavailable`, in fixed words, and the run is continued (to end failed)."""
    client = redis.Redis.from_url(redis_url)

    def broken(*_: Any) -> Any:
        raise RuntimeError("the service is broken")

    monkeypatch.setattr(sandbox_worker.SandboxWorker, "_attempt", broken)
    out = eager_task.execute.apply(args=[request(4)]).get()
    assert out["outcome"] == "unavailable_retry"
    assert client.get("test:waits:4") is None and client.llen(CONTINUE) == 0
    assert client.pttl("test:waits:pending:4") > 60_000  # its countdown plus the marker's usual life
    [message] = sandbox_messages(client)
    assert message["headers"]["eta"] is not None  # sent with a countdown, not at once
    [again], _, _ = json.loads(base64.b64decode(message["body"]))
    assert again["unavailable_since"] is not None and again["unavailable_tries"] == 1
    past = dict(again, unavailable_since=time.time() - 301)  # the default window has passed since
    assert eager_task.execute.apply(args=[past]).get()["outcome"] == "unavailable"
    stored = SandboxResult.model_validate_json(client.get("test:waits:4"))
    assert stored.error_kind == "unavailable" and stored.error == UNAVAILABLE_TEXT
    assert client.llen(CONTINUE) == 1
    client.close()


def test_a_cpu_day_overage_is_refused_at_once(eager_task: Any, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(sandbox_keys.quota_cpu_day("paced", "acme", int(time.time() // 86400)), 99)
    out = eager_task.execute.apply(args=[request(5, tier="paced")]).get()
    assert out["outcome"] == "quota_exceeded"
    stored = SandboxResult.model_validate_json(client.get("test:waits:5"))
    assert stored.error and stored.error.startswith("quota_exceeded: cpu_seconds_per_day for tenant acme")
    assert client.llen(CONTINUE) == 1 and sandbox_messages(client) == []
    client.close()


# --- real sandbox worker processes ------------------------------------------------------------------------------

TIMED = "import time\nstart = time.time()\ntime.sleep(1)\nprint(start, time.time())\n"


def test_more_calls_than_slots_all_finish_in_order(cluster: Cluster, redis_url: str, wait_tiers: Path) -> None:
    """8 one-second calls of one tenant on a tier of one concurrent execution, through 3 worker processes:
    far past the old retry limit (3 retries), every call ends with its result, one at a time, in the order
    sent; another tenant's call is not held up behind them. The first call is sent alone, and the rest once it
    holds the slot: a free slot goes to whichever call reaches the gate first, and three worker threads may
    take the first messages in any order; the line orders the calls that wait."""
    cluster.start_worker(queues="sandbox", concurrency=3, REACTQ_SANDBOX_TIERS_FILE=str(wait_tiers),
                         REACTQ_SANDBOX_BACKEND="process")
    app = Celery("sandbox-waits-producer", broker=redis_url)
    client = redis.Redis.from_url(redis_url)
    sent = time.time()
    calls = [request(i, code=TIMED, queued_at=sent + i / 1000, deadline_at=sent + 600) for i in range(8)]
    try:
        app.send_task("reactq.sandbox.execute", args=[calls[0]], queue="reactq.sandbox")
        wait_for("the first call to hold the slot",
                 lambda: client.zscore(sandbox_keys.quota_running("lane", "acme"), calls[0]["result_key"]), 30)
        for call in calls[1:]:
            app.send_task("reactq.sandbox.execute", args=[call], queue="reactq.sandbox")
        app.send_task("reactq.sandbox.execute", queue="reactq.sandbox",
                      args=[dict(request(99, code=TIMED, tenant="globex"), queued_at=time.time())])
        keys = [c["result_key"] for c in calls] + ["test:waits:99"]
        wait_for("every call's result", lambda: sum(client.exists(k) for k in keys), 120,
                 until=lambda stored: stored == len(keys))
        results = [SandboxResult.model_validate_json(client.get(k)) for k in keys]
        assert [(r.exit_code, r.error_kind) for r in results] == [(0, None)] * len(keys), results
        spans = [tuple(map(float, r.stdout.split())) for r in results]
        acme = spans[:8]
        assert acme == sorted(acme), "the calls ran in the order they were sent"
        for (_, ended), (started, _) in zip(acme, acme[1:], strict=False):
            assert ended <= started, "two of acme's calls ran at once on a tier of one"
        assert spans[8][0] < acme[-1][0], "the other tenant waited behind acme's line"
        wait_for("every call's continuation", lambda: client.llen(CONTINUE), 30, until=lambda n: n == len(keys))
        assert client.zcard(sandbox_keys.quota_line("lane", "acme")) == 0
    finally:
        client.close()
        app.close()


# --- the step path and the reaper ----------------------------------------------------------------------------------

def test_a_call_waiting_in_line_is_left_alone_and_a_lost_one_is_re_sent(
        harness: Harness, redis_url: str, wait_tiers: Path, monkeypatch: pytest.MonkeyPatch,
        celery_producer: Celery) -> None:
    """The runner's request carries the run's deadline and its pending marker; the real task, waiting in
    line, keeps that marker alive, so the reaper leaves the run be; once the task is gone (the marker
    expired) the reaper re-kicks the step and the step sends the call again."""
    harness.llm.script(call("python", {"code": "print(6*7)"}), final("42"))
    run_id = harness.submit("Use python to compute 6 * 7", tier="pro", tenant="acme")
    assert harness.drain() == [Outcome.WAITING]
    [sent] = harness.dispatch.sandbox
    run = harness.run(run_id)
    assert run.deadline_at is not None and sent["deadline_at"] == pytest.approx(run.deadline_at, abs=1)
    assert sent["pending_key"] == worker_keys.sandbox_pending(run_id, 0) and sent["queued_at"] <= time.time()

    eager_task = use_eager_task(redis_url, wait_tiers, monkeypatch)  # (its tiers are not the run's plan's)
    client = redis.Redis.from_url(redis_url)
    occupy(client, "lane")
    assert eager_task.execute.apply(args=[dict(sent, tier="lane")]).get()["outcome"] == "waiting"
    # A sandbox worker with a working backend is about (else the reaper would end the run instead).
    client.zadd(worker_keys.workers("reactq.sandbox"), {"test:sandbox-worker": time.time()})
    lost = metrics.REAPER_ACTIONS.labels(ReaperAction.SANDBOX_LOST)._value.get()
    dispatcher = harness.dispatch.as_dispatcher()
    settings = harness.rt.settings
    client.delete(worker_keys.REAPER_LOCK)
    assert reap_once(harness.rt, dispatcher, now=time.time() + settings.sandbox_redispatch_after_s + 1) == []

    client.delete(sent["pending_key"])  # the waiting task vanished and its marker expired ...
    client.delete(worker_keys.sandbox_dispatch(run_id, 0, "c1"))  # ... as had the dispatch marker by then
    client.delete(worker_keys.REAPER_LOCK)
    assert reap_once(harness.rt, dispatcher, now=time.time() + settings.sandbox_redispatch_after_s + 1) == [run_id]
    assert metrics.REAPER_ACTIONS.labels(ReaperAction.SANDBOX_LOST)._value.get() == lost + 1
    assert harness.drain() == [Outcome.WAITING]
    assert len(harness.dispatch.sandbox) == 2 and harness.dispatch.sandbox[1]["result_key"] == sent["result_key"]
    client.close()


STANDARD_OF_ONE = tier_toml("standard", (1, 1000, 1000), **LANE)  # the lane, under the name runs get


def test_runs_whose_calls_outnumber_the_slots_all_finish(cluster: Cluster, tmp_path: Path) -> None:
    """The whole path (retrying with Celery's default count lost 30 of 200 runs): a batch of runs, each
    calling python for a second, on a tier of one concurrent execution; every run finishes with its own
    program's output."""
    tiers = tmp_path / "tiers.toml"
    tiers.write_text(STANDARD_OF_ONE, encoding="utf-8")
    cluster.env["REACTQ_SANDBOX_TIERS_FILE"] = str(tiers)
    cluster.start_worker(queues="steps", concurrency=8)
    sandbox = cluster.start_worker(queues="sandbox", concurrency=3, REACTQ_SANDBOX_BACKEND="process")
    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    code = "import time\ntime.sleep(1)\nprint({} * 7)\n"
    infile.write_text("".join(json.dumps({"question": f"Run this python code:\n```python\n{code.format(i)}```"})
                              + "\n" for i in range(6)), encoding="utf-8")
    cluster.finish_batch(cluster.start_batch(infile, out), timeout=180)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6
    # The steps parked the calls whose turn had not come: no delivery only parked its call (each was delivered
    # when its turn came).
    log = cluster.log(sandbox)
    assert len(re.findall(rf"Task {re.escape(SANDBOX_TASK)}\[[^\]]+\] received", log)) >= 6
    assert re.findall(r"'outcome': '(\w+)'", log).count("waiting") == 0, log[-3000:]
    asked = []
    for line in lines:
        run = cluster.load_run(line["run_id"])
        assert run is not None and run.status.value == "succeeded", line
        i = int(run.spec.question.split("print(")[1].split(" ")[0])
        assert str(i * 7) in str(run.answer), (i, run.answer)
        asked.append(i)
    assert sorted(asked) == list(range(6))
