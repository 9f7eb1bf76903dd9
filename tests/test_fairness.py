"""Fair queues: interactive runs go first, and one tenant's backlog does not keep another tenant's
first runs waiting behind it (worker/tenancy/fairness.py). Ordering is checked, not timing."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import Cluster
from tests.fixtures_stub import StubControl
from tests.test_recovery import load_run
from tests.waiting import wait_for
from worker.config import Settings
from worker.core.models import RunSpec
from worker.names import PRIORITY_SEP, SANDBOX_QUEUE, STEP_TASK
from worker.service.submit import new_run
from worker.store import keys
from worker.store.runs import RunStore
from worker.tasks.app import STEPS_QUEUE
from worker.tenancy.fairness import BATCH_FIRST, LOWEST, WINDOW_S, batch_priorities, batch_priority


def test_priority_falls_one_level_each_time_a_tenants_recent_submissions_double() -> None:
    assert [batch_priority(n) for n in (0, 7, 8, 24, 56, 120, 248)] == [2, 2, 3, 4, 5, 6, 7]
    assert batch_priority(2_000) == LOWEST == batch_priority(10**9)


def test_a_tenants_backlog_does_not_lower_another_tenants_priority(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    store = RunStore(client)

    def priorities(tenant: str, count: int, now: float) -> list[int]:
        return batch_priorities(store.submissions.count_submissions(tenant, count, WINDOW_S, now), count)

    backlog = priorities("acme", 2_000, now=1_000_000)
    assert backlog[0] == BATCH_FIRST and backlog[-1] == LOWEST
    assert sum(p >= 8 for p in backlog) == 2_000 - 504  # all but the first 504
    assert priorities("other", 1, now=1_000_030) == [BATCH_FIRST]
    assert priorities("acme", 1, now=1_000_060) == [LOWEST]
    # Ten minutes later the window has moved on.
    assert priorities("acme", 1, now=1_000_000 + 700) == [BATCH_FIRST]


def test_recording_runs_counts_them_per_tenant_in_the_same_round_trip(redis_url: str) -> None:
    """What submit() gives each tenant's runs their priorities from (interactive runs are not counted)."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    store, settings = RunStore(client), Settings()

    def runs(*tenants: str) -> list:
        return [new_run(RunSpec(question="q", tenant=t), settings) for t in tenants]

    create = store.submissions.create_runs
    assert create(runs("acme", "acme", "other"), count_window_s=WINDOW_S) == {"acme": 0, "other": 0}
    assert create(runs("acme"), count_window_s=WINDOW_S) == {"acme": 2}
    assert create(runs("acme")) == {}  # interactive: not counted
    assert create(runs("other", "acme"), count_window_s=WINDOW_S) == {"other": 1, "acme": 3}


@pytest.mark.integration
def test_interactive_and_small_tenants_runs_overtake_a_backlog(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path, redis_url: str
) -> None:
    # Tenant "default" queues 60 runs before any worker runs; then tenant "acme" one run, and an `ask`.
    backlog = tmp_path / "backlog.jsonl"
    backlog.write_text("".join(json.dumps({"id": f"a{i}", "question": f"What is {i} + 1000?"}) + "\n"
                               for i in range(60)))
    out = tmp_path / "backlog-out.jsonl"
    big = cluster.start_batch(backlog, out)
    small_in = tmp_path / "small.jsonl"
    small_in.write_text(json.dumps({"id": "b", "question": "What is 17 * 23 + 4?", "tenant": "acme"}) + "\n")
    small_out = tmp_path / "small-out.jsonl"
    small = cluster.start_batch(small_in, small_out)
    client = redis.Redis.from_url(redis_url)
    wait_for("61 runs submitted", lambda: client.zcard(keys.ACTIVE_RUNS), 60, until=lambda runs: runs >= 61)
    asked = cluster.reactq("ask", "What is 2 to the power of 10?", "--json")
    interactive_id = json.loads(asked.stdout)["run_id"]

    cluster.start_worker(queues="steps", concurrency=2)

    def later_steps_by_list() -> dict[bytes, int]:
        """Queued messages for steps after the first, per priority list (not the base list, where only
        continuations without a priority go: reaper re-kicks, drain re-sends)."""
        found: dict[bytes, int] = {}
        for name in client.keys(f"{STEPS_QUEUE}{PRIORITY_SEP}*"):
            later = [m for m in client.lrange(name, 0, -1) if not re.search(rb"argsrepr\": \"\['[0-9a-f]+', 0\]", m)]
            if later:
                found[name] = len(later)
        return found

    # A run's later steps keep its priority (they would all land in the base list otherwise).
    wait_for("a later step queued with its run's priority", later_steps_by_list, 120, 0.05)
    assert big.wait(300) == 0 and small.wait(300) == 0
    finished = {}
    for line in map(json.loads, out.read_text().splitlines()):
        finished[line["id"]] = load_run(redis_url, line["run_id"])[0].finished_at
    small_line = json.loads(small_out.read_text())
    small_at = load_run(redis_url, small_line["run_id"])[0].finished_at
    interactive_at = load_run(redis_url, interactive_id)[0].finished_at
    assert small_line["status"] == "succeeded" and "395" in small_line["answer"]
    assert interactive_at < min(finished.values())  # ahead of the whole backlog
    behind = sum(at > small_at for at in finished.values())
    assert behind >= 45, f"only {behind} of the 60 backlog runs finished after tenant acme's one run"


def python_batch(tmp_path: Path) -> tuple[Path, Path]:
    """A batch of three python runs ("Run this python code: print(i*7)"), and where its results go."""
    batch_in = tmp_path / "python.jsonl"
    batch_in.write_text("".join(json.dumps({"id": f"p{i}", "question": f"Run this python code:\n```python\n"
                                            f"print({i}*7)\n```"}) + "\n" for i in range(3)))
    return batch_in, tmp_path / "python-out.jsonl"


def python_results(out: Path) -> list[dict]:
    """python_batch's result lines in order, each checked: succeeded, with its number in the answer."""
    lines = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda line: line["id"])
    assert [line["status"] for line in lines] == ["succeeded"] * 3
    assert all(str(i * 7) in line["answer"] for i, line in enumerate(lines)), lines
    return lines


@pytest.mark.integration
def test_a_sandbox_result_continues_its_run_at_the_runs_priority_in_one_step_delivery(
    cluster: Cluster, tmp_path: Path, redis_url: str
) -> None:
    """The continuation runs the run's next model call (worker/tasks/steps.py), so it waits its turn at the
    run's priority like that step would, and a python run takes two step deliveries, not three."""
    batch_in, out = python_batch(tmp_path)
    steps = cluster.start_worker(queues="steps", concurrency=4)
    batch = cluster.start_batch(batch_in, out)
    client = redis.Redis.from_url(redis_url)

    def sandbox_requests() -> list[dict]:
        return [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in client.lrange(SANDBOX_QUEUE, 0, -1)]

    requests = wait_for("three sandbox calls queued", sandbox_requests, 120, until=lambda r: len(r) == 3)
    assert [r["continue_priority"] for r in requests] == [BATCH_FIRST] * 3  # the batch runs' priority, not 0
    cluster.start_worker(queues="sandbox", concurrency=2)
    assert cluster.finish_batch(batch) is not None
    python_results(out)
    log = cluster.log(steps)
    received = len(re.findall(rf"Task {re.escape(STEP_TASK)}\[[^\]]+\] received", log))
    assert received == 6, log[-3000:]
    finished = [json.loads(line) for line in log.splitlines() if '"msg": "run finished"' in line]
    assert sorted(line["step"] for line in finished) == [1, 1, 1]  # the step the continuation went on to


@pytest.mark.integration
def test_a_worker_killed_in_the_step_a_continuation_went_on_to_loses_no_run(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path, redis_url: str
) -> None:
    """Step 0 is recorded by the continuation, which then waits on step 1's model call (no message exists for
    step 1): SIGKILLed there, the run is found by the reaper (its lease lapses) and finishes on another worker,
    each step recorded once."""
    batch_in, out = python_batch(tmp_path)
    victim = cluster.start_worker(queues="steps", concurrency=4)
    batch = cluster.start_batch(batch_in, out)
    client = redis.Redis.from_url(redis_url)
    wait_for("three sandbox calls queued", lambda: client.llen(SANDBOX_QUEUE), 120, until=lambda n: n == 3)
    stub_control.set_faults(latency_ms=5_000)  # step 1's model calls outlive the victim
    cluster.start_worker(queues="sandbox", concurrency=2)
    run_ids = [r.decode() for r in client.zrange(keys.ACTIVE_RUNS, 0, -1)]
    assert len(run_ids) == 3
    wait_for("step 0 recorded by each continuation", lambda: [load_run(redis_url, r)[0].current_step for r in run_ids],
             120, until=lambda steps: steps == [1, 1, 1])
    wait_for("step 1's model calls under way", lambda: stub_control.stats()["requests"], 60,
             until=lambda calls: calls >= 6)  # step 0's three, and step 1's (counted as they arrive)
    cluster.kill(victim)
    stub_control.set_faults(latency_ms=0)
    cluster.start_worker(queues="steps", concurrency=4)
    assert cluster.finish_batch(batch) is not None
    lines = python_results(out)
    for line in lines:
        run, steps = load_run(redis_url, line["run_id"])
        assert [s.index for s in steps] == [0, 1] == list(range(run.current_step))
    # The victim's three calls, orphaned, end on the stub too: none is left in flight for the next test.
    wait_for("the orphaned calls to end", lambda: stub_control.stats()["completions"], 30, until=lambda n: n >= 9)
