"""Python sessions: a run's python calls see the globals of its earlier ones, rebuilt by replay.

Pure parts (which cells a call replays, the program that replays them, run by a real python3), the step path
through the harness (what a session call sends), and the whole path on a real Docker engine: the stub model
runs one cell per step, a later cell uses an earlier one's variable, a lost sandbox worker and its containers
do not lose the state, and another run of the same tenant (same warm container) sees nothing of it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from api_stub.brain import respond
from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import signed_in
from tests.fixtures_cluster import Cluster
from tests.fixtures_sandbox import worker_containers
from tests.harness import Harness, call, final
from tests.test_steps import complete_sandbox
from tests.waiting import wait_for
from tools_sandbox import ExecuteRequest, SandboxResult
from tools_sandbox.base.models import TenantQuota, Tier
from tools_sandbox.base.session import NOTE, SessionCell, session_program
from tools_sandbox.edges.sandbox_worker import _program
from worker.core.models import Observation, SandboxFacts, Step, ToolCall
from worker.core.outcome import Outcome
from worker.core.sessions import earlier_cells
from worker.tenancy.plans import parse_plans


def run_program(cells: list[SessionCell], code: str, replay_s: float = 5.0) -> subprocess.CompletedProcess[str]:
    """The session program as the sandbox runs it (the supervisor execs it as a script), in a real python3."""
    return subprocess.run([sys.executable, "-c", session_program(cells, code, replay_s)], capture_output=True,
                          text=True, timeout=30)


# --- the program -------------------------------------------------------------------------------------------
def test_a_later_cell_sees_the_earlier_cells_globals_and_only_its_own_output() -> None:
    done = run_program([SessionCell(code="x = 21\nprint('cell one spoke')"),
                        SessionCell(code="import math\ny = math.sqrt(x * 84)")], "print(x * 2, int(y))")
    assert done.returncode == 0 and done.stdout == "42 42\n" and done.stderr == ""


def test_the_cells_namespace_holds_only_what_the_cells_defined() -> None:
    done = run_program([SessionCell(code="a = 1")], "print(sorted(k for k in globals() if k != '__builtins__'))")
    assert done.stdout.strip() == "['__name__', 'a']"


def test_a_replayed_cell_that_fails_now_says_so_and_one_that_failed_before_is_quiet() -> None:
    done = run_program([SessionCell(code="1 / 0", failed=True), SessionCell(code="import os\nos.stat('/gone')"),
                        SessionCell(code="x = 5")], "print(x)")
    assert done.returncode == 0
    assert done.stdout.splitlines() == [f"{NOTE} cell 2, replayed, failed this time: FileNotFoundError: "
                                        "[Errno 2] No such file or directory: '/gone'", "5"]


def test_replay_stops_at_its_time_and_the_new_cell_still_runs() -> None:
    done = run_program([SessionCell(code="x = 1"), SessionCell(code="import time\ntime.sleep(30)"),
                        SessionCell(code="y = 2")], "print('new cell', x, 'y' in globals())", replay_s=0.5)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{NOTE} replaying the earlier cells took longer than 0.5 s: cells 2 to 3 "
                                        "were not replayed", "new cell 1 False"]


def test_a_replayed_cell_that_swallows_the_interruption_ends_the_execution_saying_why() -> None:
    swallow = "import time\nwhile True:\n    try:\n        time.sleep(1)\n    except BaseException:\n        pass"
    done = run_program([SessionCell(code=swallow)], "print('never')", replay_s=0.3)
    assert done.returncode == 124
    assert done.stdout == (f"{NOTE} replaying cell 1 took longer than 0.3 s and it would not stop: nothing more "
                           "was run\n")


def test_the_new_cells_error_is_its_own_traceback_and_exit_code() -> None:
    done = run_program([SessionCell(code="x = 1")], "print(x)\nraise ValueError('bad value')")
    assert done.returncode == 1 and done.stdout == "1\n"
    assert 'File "<cell 2>", line 2' in done.stderr and "ValueError: bad value" in done.stderr
    assert "__reactq_session" not in done.stderr  # the wrapper's frame is not the program's


def test_cell_text_cannot_break_out_of_its_cell() -> None:
    sneaky = "s = '''\"\"\"''' + \"'''\" + '@SOURCE@ %s %(x)r {code}'"
    done = run_program([SessionCell(code=sneaky)], "print(len(s))")
    assert done.stdout == f"{len(eval(sneaky.split('=', 1)[1]))}\n"  # noqa: S307 - our own literal


TIER = Tier(name="standard", cpus=1, memory_mb=256, wall_time_s=10, cpu_time_s=5, pids=32, output_bytes=4096,
            tmpfs_mb=8, session_max_cells=2, quota=TenantQuota(concurrent_executions=1, executions_per_minute=10,
                                                               cpu_seconds_per_day=100))


def test_the_sandbox_worker_runs_code_alone_without_a_session_and_refuses_a_session_past_its_tiers_cells() -> None:
    plain = ExecuteRequest(code="print(1)", result_key="k")
    assert _program(plain, TIER) == "print(1)"
    two = plain.model_copy(update={"session": [SessionCell(code="a = 1"), SessionCell(code="b = 2")]})
    assert "__reactq_session" in (_program(two, TIER) or "") and ", 5.0)" in (_program(two, TIER) or "")
    three = plain.model_copy(update={"session": [SessionCell(code="a = 1")] * 3})
    assert _program(three, TIER) is None


# --- which cells -------------------------------------------------------------------------------------------
def _python_step(index: int, *calls: tuple[str, str, Observation]) -> Step:
    return Step(index=index, tool_calls=[ToolCall(id=cid, name="python", arguments=json.dumps({"code": code}))
                                         for cid, code, _ in calls],
                observations=[obs for _, _, obs in calls])


def _obs(call_id: str, outcome: str = "ok", **facts: Any) -> Observation:
    return Observation(call_id=call_id, tool="python", content="", outcome=outcome, sandbox=SandboxFacts(**facts))


def test_the_cells_are_the_runs_sandboxed_calls_in_order_without_those_the_sandbox_stopped() -> None:
    steps = [
        _python_step(0, ("a", "x = 1", _obs("a", exit_code=0)), ("b", "1/0", _obs("b", "error", exit_code=1))),
        Step(index=1, tool_calls=[ToolCall(id="c", name="calculator", arguments={"expression": "1+1"})],
             observations=[Observation(call_id="c", tool="calculator", content="2")]),
        _python_step(2, ("d", "while 1: pass", _obs("d", "error", flags=["timed_out"], error_kind="timeout")),
                     ("e", "big = 'x' * 10**10", _obs("e", "error", flags=["oom_killed"], error_kind="oom")),
                     ("f", "q = 1", _obs("f", "quota", error_kind="quota_exceeded")),
                     ("g", "print(1)", _obs("g", exit_code=0))),
    ]
    steps[2].tool_calls[-1] = ToolCall(id="g", name="python", arguments="print(1)")  # a plain string: the code
    assert earlier_cells(steps, ["y = 2"]) == [("x = 1", False), ("1/0", True), ("print(1)", False),
                                               ("y = 2", False)]


def test_the_stub_runs_one_cell_per_step() -> None:
    question = "Run these python cells in order:\n```python\nx = 21\n```\n```python\nprint(x * 2)\n```"
    tools = [{"type": "function", "function": {"name": "python", "parameters": {"properties": {"code": {}}}}}]
    first = respond([{"role": "user", "content": question}], tools)
    assert [json.loads(c.arguments)["code"] for c in first.tool_calls] == ["x = 21\n"]


def test_a_plan_may_make_sessions_the_default() -> None:
    text = '[plans.lab]\ntiers = ["standard"]\npython_session = true\n[plans.lab.limits]\nruns_in_flight = 1\n' \
           'submissions_per_minute = 1\nsse_streams = 1\n'
    assert parse_plans(text)["lab"].python_session is True


# --- the step path -----------------------------------------------------------------------------------------
def test_a_session_call_carries_the_earlier_cells_and_an_ordinary_call_does_not(harness: Harness) -> None:
    harness.llm.script(call("python", {"code": "x = 21"}, call_id="p1"),
                       call("python", {"code": "print(x * 2)"}, call_id="p2"), final("42"))
    run_id = harness.submit("Use python", python_session=True)
    assert harness.drain() == [Outcome.WAITING]
    [first] = harness.dispatch.sandbox
    assert first["session"] == []
    complete_sandbox(harness, first, SandboxResult(exit_code=0, stdout="", stderr="", tier="standard",
                                                   backend="process"))
    harness.deliver(*first["continue_args"])
    assert harness.drain() == [Outcome.WAITING]
    second = harness.dispatch.sandbox[1]
    assert second["code"] == "print(x * 2)" and second["session"] == [{"code": "x = 21", "failed": False}]
    complete_sandbox(harness, second, SandboxResult(exit_code=0, stdout="42\n", stderr="", tier="standard",
                                                    backend="process"))
    harness.deliver(*second["continue_args"])
    harness.drain()
    facts = [s.observations[0].sandbox for s in harness.steps(run_id)[:2]]
    assert [f.session_cells for f in facts if f is not None] == [0, 1]

    harness.llm.script(call("python", {"code": "print(1)"}, call_id="p3"), final("1"))
    harness.submit("Use python")  # no session: the request is what steps have always sent
    harness.drain()
    assert "session" not in harness.dispatch.sandbox[-1]


# --- the whole path, on a real Docker engine ---------------------------------------------------------------
CELLS = "Run these python cells in order:\n" + "".join(f"```python\n{c}\n```\n" for c in (
    "x = 21", "import time\ntime.sleep(2)\ny = x * 2", "print('the answer is', y)"))


def _ask(cluster: Cluster, question: str, *flags: str) -> dict[str, Any]:
    done = cluster.reactq("ask", question, "--wait", "--json", "--timeout", "180", *flags, check=True)
    return json.loads(done.stdout)


def _observations(cluster: Cluster, run_id: str) -> list[dict[str, Any]]:
    trace = json.loads(cluster.reactq("trace", run_id, "--json", check=True).stdout)["trace"]
    return [o for step in trace for o in step["observations"]]


@pytest.mark.docker
def test_a_later_step_uses_an_earlier_steps_variable_and_without_a_session_it_cannot(
        cluster: Cluster, sandbox_image: str) -> None:
    cluster.start_worker(queues="steps", concurrency=8)
    cluster.start_worker(queues="sandbox", concurrency=2, REACTQ_SANDBOX_BACKEND="docker",
                         REACTQ_SANDBOX_IMAGE=sandbox_image)
    run = _ask(cluster, CELLS, "--python-session")
    assert run["status"] == "succeeded" and "the answer is 42" in run["answer"], run
    observations = _observations(cluster, run["run_id"])
    assert [o["sandbox"]["session_cells"] for o in observations] == [0, 1, 2]
    assert cluster.reactq("trace", run["run_id"], check=True).stdout.count("session cell") == 3

    plain = _ask(cluster, CELLS)
    assert "NameError" in _observations(cluster, plain["run_id"])[1]["content"]

    # Another run of the same tenant, on the same warm container, sees nothing of the session.
    other = _ask(cluster, "Run these python cells in order:\n```python\nprint('x' in globals(), 'y' in globals())\n```",
                 "--python-session")
    assert _observations(cluster, other["run_id"])[0]["content"] == "False False"


@pytest.mark.docker
def test_a_lost_sandbox_worker_and_its_containers_do_not_lose_the_session(
        cluster: Cluster, sandbox_image: str) -> None:
    import docker

    cluster.start_worker(queues="steps", concurrency=8)
    env = {"REACTQ_SANDBOX_BACKEND": "docker", "REACTQ_SANDBOX_IMAGE": sandbox_image}
    first = cluster.start_worker(queues="sandbox", concurrency=2, **env)
    done = cluster.reactq("ask", CELLS, "--python-session", "--json", check=True)
    run_id = json.loads(done.stdout)["run_id"]
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    from worker.store.runs import RunStore

    store = RunStore(client)
    wait_for("the first cell to be recorded", lambda: len(store.load_steps(run_id)), 120, 0.1, until=lambda n: n >= 1)
    cluster.kill(first)  # mid-session: the second cell is in line or running on it
    engine = docker.from_env()
    for container in worker_containers(engine, first.pid):
        try:
            engine.containers.get(container["Id"]).remove(force=True)
        except docker.errors.NotFound:
            pass  # removed on its own meanwhile
    cluster.start_worker(queues="sandbox", concurrency=2, **env)
    wait_for("the run to finish", lambda: store.load_run(run_id), 240, 0.5,
             until=lambda r: r is not None and r.status.finished)
    run = store.load_run(run_id)
    assert run is not None and run.status.value == "succeeded" and "the answer is 42" in (run.answer or ""), run
    assert [o["sandbox"]["session_cells"] for o in _observations(cluster, run_id)] == [0, 1, 2]
    client.close()


@pytest.mark.docker
def test_a_batch_line_turns_the_session_on(cluster: Cluster, sandbox_image: str, tmp_path: Path) -> None:
    cluster.start_worker(queues="steps", concurrency=8)
    cluster.start_worker(queues="sandbox", concurrency=2, REACTQ_SANDBOX_BACKEND="docker",
                         REACTQ_SANDBOX_IMAGE=sandbox_image)
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "s", "question": CELLS, "python_session": True}) + "\n"
                     + json.dumps({"id": "n", "question": CELLS}) + "\n")
    out = tmp_path / "out.jsonl"
    cluster.reactq("batch", str(lines), "--out", str(out), timeout=300)
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert results["s"]["status"] == "succeeded" and "the answer is 42" in results["s"]["answer"]
    assert "the answer is 42" not in (results["n"]["answer"] or "")


@pytest.mark.integration
def test_the_api_body_turns_the_session_on_and_the_ui_shows_its_cells(
        tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="standard")  # a plan with the python tool
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4, REACTQ_SANDBOX_BACKEND="process")
    created = api.client(key).post("/v1/runs", json={"question": CELLS, "python_session": True})
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]
    tenancy_cluster.wait_for_run(run_id)
    run = api.client(key).get(f"/v1/runs/{run_id}?trace=true").json()
    assert run["status"] == "succeeded" and "the answer is 42" in run["answer"], run
    client, _ = signed_in(api, key)
    page = client.get(f"/ui/runs/{run_id}").text
    assert [int(n) for n in re.findall(r'<span class="tag">session cell (\d+)</span>', page)] == [1, 2, 3]
    refused = api.client(key).post("/v1/runs", json={"question": CELLS, "python_session": "sometimes"})
    assert refused.status_code == 422 and "python_session" in refused.text


def test_the_kinds_that_stop_a_cell_are_the_sandboxs_own() -> None:
    """worker/core may not import tools_sandbox: its copy of the ErrorKind values must stay the same set (every
    kind but the output cap, which lets the program run to its end)."""
    from tools_sandbox import ErrorKind
    from worker.core.sessions import STOPPED

    assert STOPPED == {kind.value for kind in ErrorKind} - {ErrorKind.OUTPUT_LIMIT.value}
