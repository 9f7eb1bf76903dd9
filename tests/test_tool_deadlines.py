"""No tool call can stall a worker (docs/decisions/tool-isolation.md): every inline call has a deadline, a
call past it becomes a `timeout` observation and the run goes on; a CPU-bound (isolation="process") tool's
process is killed and replaced; a hung thread tool costs a capped number of abandoned threads. Then the same
against a real Celery worker: another tenant's calculator bombs, GIL-holding and hung tools do not hold up
plain runs."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests import tool_bodies as body
from tests.fixtures_cluster import Cluster
from tests.harness import call, final
from tests.waiting import wait_for
from worker import metrics
from worker.core.models import Observation, RunStatus
from worker.core.outcome import Outcome
from worker.runtime.tool_exec import ToolExecutor
from worker.store.runs import RunStore
from worker.tools import REGISTRY, Tool, ToolRegistry


def make(name: str, func, **fields) -> Tool:
    return Tool(name, body.Input, name, func, **fields)


ARGS = body.Input(input="x")


@pytest.fixture
def executor() -> Iterator[ToolExecutor]:
    ex = ToolExecutor(timeout_s=0.5, processes=1, stuck_max=3, stuck_per_tenant=2,
                      preload=("worker.tools", "tests.tool_bodies"))
    yield ex
    ex.close()


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not; our children are reaped when killed)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


# --- threads ---------------------------------------------------------------------------------------

def test_a_hung_thread_tool_times_out_with_a_clear_message(executor: ToolExecutor) -> None:
    called = executor.call(make("hang", lambda a: threading.Event().wait() or "never"), ARGS, "acme")
    assert (called.outcome, called.error_type) == ("timeout", "timeout")
    assert called.content == "Error: hang took longer than 0.5 s and was stopped."
    assert executor.stuck_threads() == 1


def test_a_tool_deadline_overrides_the_default(executor: ToolExecutor) -> None:
    called = executor.call(make("slow", lambda a: threading.Event().wait() or "", timeout_s=0.2), ARGS, "acme")
    assert called.content == "Error: slow took longer than 0.2 s and was stopped."


def test_answers_and_errors_of_thread_tools(executor: ToolExecutor) -> None:
    assert executor.call(make("echo", body.echo), ARGS, "acme").content == "echo x"
    failed = executor.call(make("fail", body.fail), ARGS, "acme")
    assert (failed.content, failed.outcome, failed.error_type) == (
        "Error: nothing known about 'x'", "error", "not_found")
    crashed = executor.call(make("boom", body.boom), ARGS, "acme")
    assert (crashed.content, crashed.error_type) == ("Error: boom failed (RuntimeError)", "exception")


def test_stuck_threads_are_capped_per_tenant_and_per_process(executor: ToolExecutor) -> None:
    """Past 2 stuck calls of one (tool, tenant), or 3 in the process, calls are refused at once; once the
    stuck threads end, calls run again."""
    gate = threading.Event()
    stuck = make("stuck", lambda a: "done" if gate.wait() else "")
    assert [executor.call(stuck, ARGS, "acme").outcome for _ in range(2)] == ["timeout", "timeout"]
    refused = executor.call(stuck, ARGS, "acme")
    assert (refused.outcome, refused.error_type) == ("error", "busy")
    assert refused.content.startswith("Error: stuck is not answering (2 earlier call(s) still running")
    assert executor.call(stuck, ARGS, "other").outcome == "timeout"  # another tenant has its own count ...
    full = executor.call(stuck, ARGS, "third")  # ... under the process's cap of 3
    assert (full.error_type, full.content) == ("busy", "Error: stuck cannot run now (this worker has 3 calls "
                                                       "still running past their deadline); try again later.")
    assert executor.stuck_threads() == 3
    gate.set()
    wait_for("the stuck threads to end", executor.stuck_threads, 30, until=lambda n: n == 0)
    assert executor.call(stuck, ARGS, "acme").content == "done"


# --- processes -------------------------------------------------------------------------------------

def test_a_process_tool_past_its_deadline_is_killed_and_replaced(executor: ToolExecutor) -> None:
    pid = make("pid", body.pid, isolation="process", timeout_s=60)
    first = int(executor.call(pid, ARGS, "acme").content)
    # below the worker's priority, and a CPU-time cap of its own (here: the call's 60 s, and a second)
    assert os.getpriority(os.PRIO_PROCESS, first) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    cpu_limit = next(line for line in Path(f"/proc/{first}/limits").read_text().splitlines()
                     if line.startswith("Max cpu time")).split()[3]
    assert 60 < int(cpu_limit) <= 64
    spun = executor.call(make("spin", body.spin, isolation="process", timeout_s=1), ARGS, "acme")
    assert (spun.outcome, spun.content) == ("timeout", "Error: spin took longer than 1 s and was stopped.")
    assert not alive(first)  # the GIL-holding call's process is gone, not left spinning
    second = int(executor.call(pid, ARGS, "acme").content)
    assert second != first and alive(second)
    assert executor.stuck_threads() == 0


def test_one_tenant_holds_at_most_its_share_of_the_tool_processes() -> None:
    """With 2 processes and 1 per tenant, acme's spinning call leaves the other process to tenant b; acme's
    next call is refused at once."""
    ex = ToolExecutor(processes=2, processes_per_tenant=1, preload=("worker.tools", "tests.tool_bodies"))
    try:
        spinning: list = []
        spin = make("spin", body.spin, isolation="process", timeout_s=3)
        worker = threading.Thread(target=lambda: spinning.append(ex.call(spin, ARGS, "acme")))
        worker.start()
        wait_for("acme's call to hold a process", lambda: ex.process_calls("acme"), 30)
        refused = ex.call(make("echo", body.echo, isolation="process", timeout_s=60), ARGS, "acme")
        assert (refused.error_type, refused.content) == (
            "busy", "Error: echo is busy with 1 earlier call(s) of yours; try again when they have answered.")
        assert ex.call(make("echo", body.echo, isolation="process", timeout_s=60), ARGS, "b").content == "echo x"
        worker.join(60)
        assert [c.outcome for c in spinning] == ["timeout"] and ex.process_calls("acme") == 0
    finally:
        ex.close()


def test_errors_and_crashes_of_process_tools(executor: ToolExecutor) -> None:
    failed = executor.call(make("fail", body.fail, isolation="process", timeout_s=60), ARGS, "acme")
    assert (failed.content, failed.error_type) == ("Error: nothing known about 'x'", "not_found")
    boom = executor.call(make("boom", body.boom, isolation="process", timeout_s=60), ARGS, "acme")
    assert (boom.content, boom.error_type) == ("Error: boom failed (RuntimeError)", "exception")
    crashed = executor.call(make("crash", body.crash, isolation="process", timeout_s=60), ARGS, "acme")
    assert (crashed.content, crashed.outcome, crashed.error_type) == (
        "Error: crash failed (its process exited)", "error", "crashed")
    assert executor.call(make("echo", body.echo, isolation="process", timeout_s=60), ARGS, "a").content == "echo x"


def test_a_process_tools_memory_is_capped() -> None:
    """2 GiB asked of a 256 MB cap: the call fails with a MemoryError, its process serves the next call."""
    ex = ToolExecutor(processes=1, memory_mb=256, preload=("worker.tools", "tests.tool_bodies"))
    try:
        hog = ex.call(make("hog", body.hog, isolation="process", timeout_s=60), ARGS, "acme")
        assert (hog.content, hog.error_type) == ("Error: hog failed (MemoryError)", "exception")
        pid = make("pid", body.pid, isolation="process", timeout_s=60)
        first = ex.call(pid, ARGS, "acme").content
        assert ex.call(pid, ARGS, "acme").content == first
    finally:
        ex.close()


def test_a_process_tool_whose_function_cannot_be_sent_fails_cleanly(executor: ToolExecutor) -> None:
    called = executor.call(make("local", lambda a: "x", isolation="process", timeout_s=60), ARGS, "acme")
    assert called.outcome == "error" and called.content.startswith("Error: local failed (")


def test_tool_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="isolation must be one of"):
        make("t", body.echo, isolation="fork")
    with pytest.raises(ValueError, match="timeout_s must be above 0"):
        make("t", body.echo, timeout_s=0)


# --- the step path (in process): a timed-out call is an observation, counted, and the run goes on ------

def test_a_call_past_its_deadline_becomes_a_timeout_observation_and_the_run_goes_on(make_harness: Any) -> None:
    harness = make_harness()
    tools = ToolRegistry()
    for t in REGISTRY.all():
        tools.register(t)
    tools.register(make("hang", lambda a: threading.Event().wait() or "never", timeout_s=0.3))
    harness.rt.tools = tools  # this runtime's registry (REGISTRY itself is left as it is)
    before = (metrics.TOOL_FAILURES.labels("hang", "timeout")._value.get(),
              metrics.TOOL_CALLS.labels("hang", "timeout")._value.get())
    harness.llm.script(call("hang", {"input": "x"}), final("The service did not answer."))
    run_id = harness.submit("Ask the service")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    [obs] = harness.steps(run_id)[0].observations
    assert (obs.outcome, obs.content) == ("timeout", "Error: hang took longer than 0.3 s and was stopped.")
    assert harness.run(run_id).status == RunStatus.SUCCEEDED
    assert any("hang took longer than 0.3 s" in str(m.get("content")) for m in harness.llm.requests[1])
    assert (metrics.TOOL_FAILURES.labels("hang", "timeout")._value.get(),
            metrics.TOOL_CALLS.labels("hang", "timeout")._value.get()) == (before[0] + 1, before[1] + 1)


# --- a real worker: another tenant's bombs do not hold up plain runs ---------------------------------

DEADLINE_S = 45  # spin's and hang's: the plain runs all end long before (generous on a loaded machine)
BOMBS = {
    "spin": ("call spin with 1", "timeout", f"Error: spin took longer than {DEADLINE_S} s and was stopped."),
    "hang": ("call hang with 1", "timeout", f"Error: hang took longer than {DEADLINE_S} s and was stopped."),
    "round": ("call calculator with round(1, -10**9)", "error", "Error: round digits out of range"),
    "power": ("call calculator with (10**4000)**10000", "error", "Error: result has more than 4000 digits"),
    "modpow": ("call calculator with pow(10**3999+7, 10**3999+1, 10**3999+9)", "error",
               "Error: modular power too large"),
}
PLAIN = {f"p{i}": (f"What is {i} * 7 + {i}?", str(i * 7 + i)) for i in range(1, 4)}


def write_batch(path: Path, tenant: str, questions: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": qid, "question": q, "tenant": tenant}) + "\n"
                            for qid, q in questions.items()))
    return path


def results(out: Path) -> dict[str, dict]:
    return {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}


@pytest.mark.integration
def test_bombs_and_hung_tools_of_one_tenant_do_not_hold_up_another(cluster: Cluster, tmp_path: Path) -> None:
    """Tenant acme's GIL-holding and hung tools run (a 45 s deadline) while tenant default's plain runs all
    finish on the same worker; acme's runs then end with clear observations, and the process pool, its
    spinning process killed, still serves calls."""
    markers = tmp_path / "markers"
    markers.mkdir()
    cluster.start_worker(queues="steps", concurrency=8, REACTQ_TOOL_MODULES='["tests.hostile_tools"]',
                         REACTQ_TEST_MARKERS=str(markers), REACTQ_TEST_TOOL_TIMEOUT_S=str(DEADLINE_S))
    bombs = cluster.start_batch(write_batch(tmp_path / "bombs.jsonl", "acme", {k: v[0] for k, v in BOMBS.items()}),
                                tmp_path / "bombs.out")
    wait_for("spin and hang to be running", lambda: {p.name for p in markers.iterdir()} >= {"spin", "hang"}, 120)

    plain_out = tmp_path / "plain.out"
    assert cluster.reactq("batch", str(write_batch(tmp_path / "plain.jsonl", "default",
                                                   {k: v[0] for k, v in PLAIN.items()})),
                          "--out", str(plain_out)).returncode == 0
    for qid, (_, answer) in PLAIN.items():
        line = results(plain_out)[qid]
        assert line["status"] == "succeeded" and answer in line["answer"], line
    runs = runs_of(cluster, "acme")
    # acme's spinning and hung calls were still in flight when every plain run had finished
    # (a run's first step marks it running only when it is recorded)
    assert [cluster.run_status(runs[k]) for k in ("spin", "hang")] == ["queued", "queued"]

    cluster.finish_batch(bombs)
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    try:
        store = RunStore(client)
        for qid, (_, outcome, text) in BOMBS.items():
            line = results(tmp_path / "bombs.out")[qid]
            assert line["status"] == "succeeded", line  # the run went on: the model heard why and answered
            [obs] = store.load_steps(line["run_id"])[0].observations
            assert isinstance(obs, Observation) and obs.outcome == outcome and obs.content.startswith(text), obs
            assert "Traceback" not in obs.content and "/srv" not in obs.content
    finally:
        client.close()

    again = tmp_path / "again.out"
    assert cluster.reactq("batch", str(write_batch(tmp_path / "again.jsonl", "acme", {"c": "call crunch with 5"})),
                          "--out", str(again)).returncode == 0
    assert "echo 5" in results(again)["c"]["answer"]  # a fresh process took the killed one's place


def runs_of(cluster: Cluster, tenant: str) -> dict[str, str]:
    """Batch line id -> run id of the tenant's runs (read from the store: a batch's output file fills only
    as its runs end)."""
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    try:
        store = RunStore(client)
        found = {}
        for key in client.scan_iter("reactq:run:*"):
            parts = key.decode().split(":")
            if len(parts) == 3 and (run := store.load_run(parts[2])) is not None and run.spec.tenant == tenant:
                found[run.spec.client_id or run.id] = run.id
        return found
    finally:
        client.close()
