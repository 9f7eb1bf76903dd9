"""MCP servers' tools through real `reactq worker` processes and the stub model, in both protocol modes,
and a stdio server killed while a batch's calls are in flight: every run still ends with an answer (those
whose call the kill cut off say the server was not available), the worker lives, and the server is
started again for the next calls."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.fixtures_cluster import Cluster
from tests.fixtures_stub import StubControl
from tests.test_mcp import EVERYTHING, server_pids
from tests.waiting import wait_for

SERVERS = json.dumps({"everything": {"command": ["node", str(EVERYTHING), "stdio"], "timeout_s": 60}})


def write_batch(path: Path, questions: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": qid, "question": q}) + "\n" for qid, q in questions.items()))
    return path


def results(out: Path) -> dict[str, dict]:
    return {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["tools", "text"])
def test_a_servers_tool_answers_runs_on_a_real_worker(cluster: Cluster, tmp_path: Path, mode: str) -> None:
    cluster.start_worker(queues="steps", concurrency=4, REACTQ_MCP_SERVERS=SERVERS)
    out = tmp_path / "out.jsonl"
    questions = {f"e{i}": f"call echo with hello {mode} {i}" for i in range(3)}
    questions["sum"] = 'call get-sum with {"a": 17, "b": 25}'
    done = cluster.reactq("batch", str(write_batch(tmp_path / "in.jsonl", questions)), "--out", str(out),
                          REACTQ_MODE=mode)
    assert done.returncode == 0, done.stderr
    got = results(out)
    for i in range(3):
        assert got[f"e{i}"]["status"] == "succeeded" and f"Echo: hello {mode} {i}" in got[f"e{i}"]["answer"], got
    assert "42" in got["sum"]["answer"], got["sum"]


@pytest.mark.integration
def test_a_server_killed_mid_batch_costs_only_the_calls_it_cut_off(cluster: Cluster, tmp_path: Path,
                                                                   stub_control: StubControl) -> None:
    worker = cluster.start_worker(queues="steps", concurrency=8, REACTQ_MCP_SERVERS=SERVERS)
    slow = '{"duration": 20, "steps": 2}'
    questions = {f"slow{i}": f"call trigger-long-running-operation with {slow}" for i in range(4)}
    batch = cluster.start_batch(write_batch(tmp_path / "slow.jsonl", questions), tmp_path / "slow.out")
    wait_for("the server to be started", lambda: server_pids(worker.pid), 120)
    # the four calls are in flight once the model has been asked four times (a call lasts 20 s)
    wait_for("four model turns", lambda: stub_control.stats()["completions"], 120, until=lambda n: n >= 4)
    [killed] = server_pids(worker.pid)
    os.kill(killed, signal.SIGKILL)
    cluster.finish_batch(batch)
    got = results(tmp_path / "slow.out")
    assert len(got) == 4 and all(line["status"] == "succeeded" for line in got.values()), got
    cut = [line for line in got.values() if "is not available right now" in line["answer"]]
    assert cut, got  # the model heard the server went away, in words of ours
    assert not [line for line in got.values() if "Traceback" in line["answer"] or "Error(" in line["answer"]]

    out = tmp_path / "after.out"
    done = cluster.reactq("batch", str(write_batch(tmp_path / "after.jsonl", {"a": "call echo with back again"})),
                          "--out", str(out))
    assert done.returncode == 0 and "Echo: back again" in results(out)["a"]["answer"], done.stderr
    assert worker.poll() is None
    assert server_pids(worker.pid) - {killed}  # a new process took the killed one's place


@pytest.mark.integration
def test_a_workers_stdio_servers_stop_with_it(cluster: Cluster, tmp_path: Path) -> None:
    worker = cluster.start_worker(queues="steps", concurrency=2, REACTQ_MCP_SERVERS=SERVERS)
    out = tmp_path / "out.jsonl"
    done = cluster.reactq("batch", str(write_batch(tmp_path / "in.jsonl", {"a": "call echo with hi"})),
                          "--out", str(out))
    assert done.returncode == 0 and "Echo: hi" in results(out)["a"]["answer"], done.stderr
    [server] = server_pids(worker.pid)
    os.kill(worker.pid, signal.SIGTERM)  # the worker alone: its server is not in the signal's way
    worker.wait(60)
    wait_for("the server to end", lambda: not psutil.pid_exists(server)
             or psutil.Process(server).status() == psutil.STATUS_ZOMBIE, 30)
