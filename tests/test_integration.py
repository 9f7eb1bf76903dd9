"""End to end: real redis-server, real `reactq worker` processes, the real api_stub over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_sandbox import executing_containers, worker_containers
from tests.waiting import wait_for
from worker.names import STEPS_QUEUE
from worker.store import keys

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parent.parent / "worker" / "data" / "sample_batch.jsonl"


def read_results(path: Path) -> dict[str, dict]:
    return {line["id"]: line for line in map(json.loads, path.read_text().splitlines())}


def assert_all_answered(out: Path, expected: dict[str, str]) -> dict[str, dict]:
    """Every expected id has a result line that succeeded with the expected answer in it."""
    results = read_results(out)
    assert set(results) == set(expected)
    for qid, line in results.items():
        assert line["status"] == "succeeded", line
        assert expected[qid].lower() in line["answer"].lower(), line
    return results


def expected_answers() -> dict[str, str]:
    return {item["id"]: item["expected"] for item in map(json.loads, SAMPLE.read_text().splitlines())}


@pytest.mark.parametrize("mode", ["tools", "text"])
def test_sample_batch_end_to_end(cluster: Cluster, tmp_path: Path, mode: str) -> None:
    cluster.start_worker(REACTQ_MODE=mode)
    out = tmp_path / "out.jsonl"
    result = cluster.reactq("batch", str(SAMPLE), "--out", str(out), REACTQ_MODE=mode)
    assert result.returncode == 0, result.stderr
    results = assert_all_answered(out, expected_answers())
    for line in results.values():
        assert line["usage"]["prompt_tokens"] > 0 and line["usage"]["completion_tokens"] > 0
    if mode == "tools":  # the multi-part questions were answered with parallel tool calls in one step
        parallel = [r for r in results.values() if r["steps"] == 2 and ";" in (r["answer"] or "")]
        assert parallel, "expected at least one run answered with parallel calls in one step"


# What a step worker, the API or a sandbox worker loads, and `reactq batch` must not: every CLI of a batch
# spends its imports on the machine its runs use (BENCHMARKS.md, "`reactq batch` loads what it runs").
NOT_FOR_THE_CLI = ("worker.core.engine", "worker.core.parser", "worker.runtime.runner", "openai", "fastapi", "docker")


def test_a_batch_cli_loads_none_of_the_workers_code(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_worker(queues="steps", concurrency=4)
    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    infile.write_text(json.dumps({"id": "q", "question": "What is 6 * 7?"}) + "\n")
    probe = ("import atexit, sys\n"
             f"atexit.register(lambda: print('LOADED', [m for m in {NOT_FOR_THE_CLI!r} if m in sys.modules]))\n"
             f"sys.argv = ['reactq', 'batch', {str(infile)!r}, '--out', {str(out)!r}]\n"
             "from worker.cli import main\n"
             "main()\n")
    done = subprocess.run([sys.executable, "-c", probe], env=cluster.env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert read_results(out)["q"]["status"] == "succeeded"
    assert done.stdout.split("LOADED", 1)[1].strip() == "[]", done.stdout


@pytest.mark.docker
def test_python_questions_run_in_docker_sandboxes(cluster: Cluster, sandbox_image: str, tmp_path: Path) -> None:
    """The whole data path with the production backend: step worker → reactq.sandbox → Docker → next step."""
    cluster.start_worker(queues="steps", concurrency=16)
    cluster.start_worker(queues="sandbox", concurrency=4, REACTQ_SANDBOX_BACKEND="docker",
                         REACTQ_SANDBOX_IMAGE=sandbox_image)
    items = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    python_items = [i for i in items if any(w in i["question"].lower() for w in ("prime", "fibonacci", "reverse"))]
    infile = tmp_path / "in.jsonl"
    infile.write_text("".join(json.dumps({"id": i["id"], "question": i["question"]}) + "\n" for i in python_items))
    out = tmp_path / "out.jsonl"
    assert cluster.reactq("batch", str(infile), "--out", str(out)).returncode == 0
    for item in python_items:
        line = read_results(out)[item["id"]]
        assert line["status"] == "succeeded" and item["expected"] in line["answer"], line
        trace = json.loads(cluster.reactq("trace", line["run_id"], "--json").stdout)["trace"]
        assert trace[0]["tool_calls"][0]["name"] == "python"
        assert trace[0]["observations"][0]["outcome"] == "ok"


def test_limits_end_runs_with_their_status(cluster: Cluster, stub_control) -> None:
    stub_control.set_faults(latency_ms=1500)  # the first step's reply arrives after the 1 s deadline
    cluster.start_worker(queues="steps", concurrency=8, REACTQ_RUN_DEADLINE_S="1")
    timed_out = json.loads(cluster.reactq("ask", "What is 3 * 3?", "--wait", "--json",
                                          REACTQ_RUN_DEADLINE_S="1").stdout)
    assert timed_out["status"] == "timeout" and "deadline" in timed_out["error"]
    capped = json.loads(cluster.reactq("ask", "What is 3 * 4?", "--wait", "--json", "--max-steps", "1").stdout)
    assert capped["status"] == "max_steps" and "max_steps=1" in capped["error"]
    # the step cap is followed by one last call, tools disabled, for the best answer from what was gathered
    assert capped["steps"] == 2 and capped["partial"] is True and capped["answer"], capped
    trace = json.loads(cluster.reactq("trace", capped["run_id"], "--json").stdout)["trace"]
    assert [s["best_effort"] for s in trace] == [False, True] and trace[1]["final_answer"] == capped["answer"]


def test_worker_processes_flag_runs_and_stops_several_processes(cluster: Cluster, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "worker", "--queues", "steps", "-c", "4",
                             "--processes", "2"], env=cluster.env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    wait_for("two step worker processes", lambda: client.zcard(keys.workers(STEPS_QUEUE)), 60,
             until=lambda workers: workers >= 2)
    assert client.zcard(keys.workers(STEPS_QUEUE)) == 2
    assert json.loads(cluster.reactq("ask", "What is 5 * 5?", "--wait", "--json").stdout)["answer"] == "25"
    proc.terminate()
    assert proc.wait(30) == 0


@pytest.mark.docker
def test_sandbox_worker_killed_mid_execution_leaves_no_container_and_the_run_resumes(
    cluster: Cluster, sandbox_image: str, redis_url: str
) -> None:
    import docker

    sandbox_env = {"REACTQ_SANDBOX_BACKEND": "docker", "REACTQ_SANDBOX_IMAGE": sandbox_image,
                   "REACTQ_SANDBOX_REDISPATCH_AFTER_S": "10"}
    cluster.env["REACTQ_SANDBOX_REDISPATCH_AFTER_S"] = "10"
    cluster.start_worker(queues="steps", concurrency=4)
    victim = cluster.start_worker(queues="sandbox", concurrency=2, **sandbox_env)
    run_id = cluster.reactq("ask", "Wait 4 seconds and then print resumed").stdout.strip()
    client = redis.Redis.from_url(redis_url)
    wait_for(f"run {run_id} to dispatch its python call",
             lambda: client.keys(keys.sandbox_dispatch(run_id, 0, "*")), 30)
    engine = docker.from_env()
    wait_for(f"run {run_id}'s python call to be executing in one of the victim's containers",
             lambda: executing_containers(engine, victim.pid), 30)
    cluster.kill(victim)
    assert worker_containers(engine, victim.pid), (
        "the killed worker's containers should be there until someone reaps them")
    cluster.start_worker(queues="sandbox", concurrency=2, **sandbox_env)  # reaps orphans at start-up
    run = cluster.wait_for_run(run_id, timeout=90)
    assert run["status"] == "succeeded" and run["answer"] == "resumed", run
    assert worker_containers(engine, victim.pid) == []


def test_a_reflection_answered_in_prose_is_a_thought_and_the_run_goes_on(cluster: Cluster) -> None:
    """Tools mode, where a prose reply would otherwise be the final answer (text mode: tests/test_steps.py)."""
    cluster.start_worker(queues="steps", concurrency=4, REACTQ_REFLECT_EVERY="1")
    run = json.loads(cluster.reactq("ask", "What is 17 * 23 + 4?", "--wait", "--json", "--timeout", "60").stdout)
    assert run["status"] == "succeeded" and run["answer"] == "395", run
    trace = json.loads(cluster.reactq("trace", run["run_id"], "--json").stdout)["trace"]
    assert [s["reflection"] for s in trace] == [False, True, False]
    assert trace[1]["thought"].startswith("So far I have 1 observation(s)") and trace[1]["final_answer"] is None
