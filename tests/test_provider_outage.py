"""A model provider that goes away is waited out, not failed: real redis-server, real Celery workers, the real
`reactq batch`, and the stub as its own process, killed with SIGKILL mid-batch and started again on the same
port. A provider that never answers within the run's deadline ends the run `timeout`, not `failed`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_services import free_port, wait_for_port
from tests.waiting import wait_for
from worker.store import keys
from worker.store.ops import OpsStore

pytestmark = pytest.mark.integration


def _start_stub(port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "stub", "--port", str(port), "--latency-ms", "400"],
                            env=env, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    wait_for_port(port, 30, owner=proc)
    return proc


def _waiting_on_provider(cluster: Cluster, client: redis.Redis) -> list[str]:
    waiting = []
    for raw in client.zrange(keys.ACTIVE_RUNS, 0, -1):
        run = cluster.load_run(raw.decode())
        if run is not None and run.waiting_on == "provider":
            waiting.append(run.id)
    return waiting


def test_a_provider_killed_mid_batch_for_30_s_leaves_every_run_answered(cluster: Cluster, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "stub.log"
    stub = _start_stub(port, cluster.env, log)
    cluster.env.update({"REACTQ_LLM_BASE_URL": f"http://127.0.0.1:{port}/v1", "REACTQ_LLM_MAX_RETRIES": "1",
                        "REACTQ_LLM_TIMEOUT_S": "5", "REACTQ_LLM_CIRCUIT_BASE_S": "0.5",
                        "REACTQ_LLM_CIRCUIT_MAX_S": "2"})
    cluster.start_worker(queues="steps", concurrency=3)
    questions = {f"q{i}": (f"What is {i + 11} * {i + 3}?", str((i + 11) * (i + 3))) for i in range(12)}
    infile = tmp_path / "in.jsonl"
    infile.write_text("".join(json.dumps({"id": k, "question": q}) + "\n" for k, (q, _) in questions.items()))
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    try:
        cluster.wait_for_results(out, 1, 60)
        os.killpg(stub.pid, signal.SIGKILL)  # mid-batch: the rest of the runs are queued or mid-step
        stub.wait(10)
        killed_at = time.monotonic()
        waiting = wait_for("a run to show it waits on the provider", lambda: _waiting_on_provider(cluster, client),
                           30)
        circuits = wait_for("the ops page's figures to show the open circuit",
                            lambda: [c.circuit_open_ms for c in OpsStore(client).read(["reactq-stub"]).limiters
                                     if c.circuit_open_ms > 0], 30)
        time.sleep(max(0.0, 30 - (time.monotonic() - killed_at)))  # an outage of 30 s in all
        done_before = len(out.read_text().splitlines())
        stub = _start_stub(port, cluster.env, log)  # the same address, as a restarted server would be
        errors = cluster.finish_batch(batch, timeout=180)
    finally:
        client.close()
        if stub.poll() is None:
            os.killpg(stub.pid, signal.SIGKILL)
            stub.wait(10)
    assert waiting and circuits
    assert done_before < len(questions), "the outage should have come mid-batch"
    results: dict[str, Any] = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(results) == sorted(questions)
    wrong = {k: (r["status"], r.get("answer"), r.get("error")) for k, r in results.items()
             if r["status"] != "succeeded" or r.get("answer") != questions[k][1]}
    assert not wrong, wrong
    assert batch.returncode == 0, errors


def test_a_provider_that_never_answers_ends_the_run_at_its_deadline_as_timeout(cluster: Cluster,
                                                                               stub_control: Any) -> None:
    """Every call times out (1 s each), and the run has 6 s: it waits on the provider, then ends `timeout` with
    the reason, not `failed` after the client's retries."""
    stub_control.set_faults(timeout_rate=1.0, timeout_s=30)
    cluster.start_worker(queues="steps", concurrency=4, REACTQ_LLM_TIMEOUT_S="1", REACTQ_LLM_MAX_RETRIES="1",
                         REACTQ_LLM_CIRCUIT_BASE_S="0.5")
    run_id = cluster.reactq("ask", "What is 3 * 5?", REACTQ_RUN_DEADLINE_S="6").stdout.strip()
    run = cluster.wait_for_run(run_id, 120)  # a worker starts slowly on a loaded machine; the 6 s count from
    # the run's first step
    assert run["status"] == "timeout", run
    assert "deadline reached while the model provider was unavailable" in run["error"], run["error"]
    requests = stub_control.stats()["requests"]
    assert 2 <= requests <= 12, requests  # two per delivery at most (a timeout is repeated once), in 6 s
