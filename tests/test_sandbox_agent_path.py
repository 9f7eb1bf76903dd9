"""A hostile program through the normal agent path: the model calls `python`, the code forges the report.

Real step worker and sandbox worker (Docker backend) processes, the api_stub model (which sends a
"Run this python code: ```...```" block verbatim), real Redis: the run finishes; the forgery cannot
reach the supervisor (another uid), so the model's observation is the program's own PermissionError,
honestly reported; the sandbox worker counts two `error` outcomes and no `protocol_violation` or
`unavailable`; and none of the worker's containers is left executing.
"""

from __future__ import annotations

import json

import pytest

from tests.fixtures_cluster import Cluster, metrics_port
from tests.fixtures_prometheus import scrape, series, total
from tests.fixtures_sandbox import executing_containers
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
