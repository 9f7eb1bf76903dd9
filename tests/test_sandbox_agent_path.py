"""A hostile program through the normal agent path: the model calls `python`, the code forges the report.

Real step worker and sandbox worker (Docker backend) processes, the api_stub model (which sends a
"Run this python code: ```...```" block verbatim), real Redis: the run finishes; the forgery cannot
reach the supervisor (another uid), so the model's observation is the program's own PermissionError,
honestly reported; the sandbox worker counts two `error` outcomes and no `protocol_violation` or
`unavailable`; and none of the worker's containers is left executing. And a batch of python runs through
the same path finishes right while the sandbox worker's containers are removed from outside again and again.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.fixtures_cluster import Cluster, metrics_port
from tests.fixtures_prometheus import scrape, series, total
from tests.fixtures_sandbox import executing_containers, worker_containers
from tests.waiting import wait_for

FORGED = """import os, struct
payload = b'{"signal": 9, "cpu_s": "a", "oom_kills": "x"}'
supervisor = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])  # the spawner's parent
fd = os.open(f"/proc/{supervisor}/fd/1", os.O_WRONLY)
os.write(fd, b"X" + struct.pack(">I", len(payload)) + payload)
"""
NESTED = """import os, struct
payload = b"[" * 5000 + b"]" * 5000
supervisor = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])  # the spawner's parent
fd = os.open(f"/proc/{supervisor}/fd/1", os.O_WRONLY)
os.write(fd, b"X" + struct.pack(">I", len(payload)) + payload)
"""


@pytest.mark.docker
def test_a_forged_report_is_refused_and_the_model_sees_the_honest_result(cluster: Cluster, sandbox_image: str) -> None:
    import docker

    port = metrics_port()
    cluster.start_worker(queues="steps", concurrency=8)
    sandbox = cluster.start_worker(queues="sandbox", concurrency=2, metrics_port=port,
                                   REACTQ_SANDBOX_BACKEND="docker", REACTQ_SANDBOX_IMAGE=sandbox_image)
    for code in (FORGED, NESTED):
        run = json.loads(cluster.reactq("ask", f"Run this python code:\n```python\n{code}```", "--wait",
                                        "--json", "--timeout", "120").stdout)
        assert run["status"] not in ("queued", "running"), run
        trace = json.loads(cluster.reactq("trace", run["run_id"], "--json").stdout)["trace"]
        assert trace[0]["tool_calls"][0]["name"] == "python"
        observation = trace[0]["observations"][0]
        assert "PermissionError" in observation["content"] and observation["outcome"] == "error", observation
    samples = scrape(f"http://127.0.0.1:{port}/metrics")
    assert total(samples, "reactq_sandbox_executions_total", outcome="error") == 2
    assert total(samples, "reactq_sandbox_executions_total", outcome="protocol_violation") == 0
    assert total(samples, "reactq_sandbox_executions_total", outcome="unavailable") == 0
    assert total(samples, "reactq_sandbox_cpu_seconds_total") > 0
    # The refused attacks left the container clean: it waits, bound to its tenant, to serve it again.
    assert total(samples, "reactq_sandbox_warm_containers", state="bound") >= 1
    # The worker's line pump reports the calls waiting in line (none now), per tier.
    wait_for("the sandbox worker to report its waiting calls",
             lambda: series(scrape(f"http://127.0.0.1:{port}/metrics"), "reactq_sandbox_calls_waiting"), 10, 0.2)
    assert total(scrape(f"http://127.0.0.1:{port}/metrics"), "reactq_sandbox_calls_waiting") == 0

    engine = docker.from_env()
    # The worker's idle warm containers are running by design; the executed ones must be gone.
    wait_for("no container of the sandbox worker to be executing a program",
             lambda: executing_containers(engine, sandbox.pid), 20, 0.2, until=lambda busy: busy == [])


def _python_batch(path: Path, runs: int) -> dict[str, str]:
    """A batch file of `runs` python runs, each a little slow (so removals catch programs mid-run); their
    expected answers by id (the stub answers with the program's last line)."""
    expected = {}
    with path.open("w") as f:
        for i in range(runs):
            code = f"import time\ntime.sleep(0.4)\nprint({7000 + i} * 3)\n"
            f.write(json.dumps({"id": f"p{i}", "question": f"Run this python code:\n```python\n{code}```"}) + "\n")
            expected[f"p{i}"] = str((7000 + i) * 3)
    return expected


@pytest.mark.docker
def test_a_batch_finishes_right_while_the_pools_containers_are_removed_again_and_again(
        cluster: Cluster, sandbox_image: str, tmp_path: Path) -> None:
    """An operator's `docker rm -f` of every container of the sandbox worker, once a second while the batch
    runs: idle, warm and executing ones alike. Every run succeeds with its program's real output; none is
    told its program interfered with the sandbox's reporting."""
    import docker
    import docker.errors

    port = metrics_port()
    cluster.start_worker(queues="steps", concurrency=8)
    sandbox = cluster.start_worker(queues="sandbox", concurrency=4, metrics_port=port,
                                   REACTQ_SANDBOX_BACKEND="docker", REACTQ_SANDBOX_IMAGE=sandbox_image)
    engine = docker.from_env()
    expected = _python_batch(tmp_path / "in.jsonl", 12)
    removed: list[str] = []
    stop = threading.Event()

    def remove_again_and_again() -> None:
        while not stop.wait(1.0):
            for container in worker_containers(engine, sandbox.pid, running=True):
                try:
                    engine.api.remove_container(container["Id"], force=True)
                    removed.append(container["Id"])
                except docker.errors.APIError:
                    pass  # retired by the worker meanwhile

    out = tmp_path / "out.jsonl"
    remover = threading.Thread(target=remove_again_and_again, daemon=True)
    remover.start()
    try:
        stderr = cluster.finish_batch(cluster.start_batch(tmp_path / "in.jsonl", out), timeout=400)
    finally:
        stop.set()
        remover.join(30)
    results = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert {qid: (r.get("status"), (r.get("answer") or "").strip()) for qid, r in results.items()} == \
        {qid: ("succeeded", answer) for qid, answer in expected.items()}, stderr
    assert len(removed) >= 4, removed  # the removals did happen, repeatedly
    samples = scrape(f"http://127.0.0.1:{port}/metrics")
    assert total(samples, "reactq_sandbox_executions_total", outcome="protocol_violation") == 0
    assert total(samples, "reactq_sandbox_executions_total", outcome="ok") >= len(expected)
    # The worker saw the removals as its host's trouble: containers found gone, or lost under a call.
    assert total(samples, "reactq_sandbox_retired_total", reason="gone") + \
        total(samples, "reactq_sandbox_retired_total", reason="lost") >= 1
