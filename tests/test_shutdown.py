"""SIGTERM gives a warm shutdown: the worker takes no new step, finishes the ones it runs (or, past the
drain timeout, hands them back to the queue), and no run is lost or asks the model twice for a reply
that had arrived. The reaper is kept out of it (one pass at start, then none for 10 minutes), so
recovery is the drain's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.fixtures_cluster import Cluster
from tests.fixtures_prometheus import scrape, total
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import inline_questions, load_run
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

NO_REAPER = {"REACTQ_STALE_AFTER_S": "600", "REACTQ_REAPER_INTERVAL_S": "600"}


def stub_in_flight(stub_control: StubControl) -> float:
    return total(scrape(f"{stub_control.root_url}/metrics"), "reactq_stub_requests_in_flight")


def sigterm(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)


def test_sigterm_finishes_the_steps_in_flight_takes_no_new_ones_and_loses_nothing(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path, redis_url: str
) -> None:
    stub_control.set_faults(latency_ms=1500)
    stopping = cluster.start_worker(queues="steps", concurrency=6, **NO_REAPER)
    infile, expected = inline_questions(tmp_path)
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    wait_for("6 LLM calls in flight", lambda: stub_in_flight(stub_control), 60, until=lambda calls: calls >= 6)
    sigterm(stopping)
    stopping.wait(60)  # warm shutdown: the calls in flight finish (1.5 s), then the process ends
    assert stopping.returncode == 0
    lines = len(out.read_text().splitlines()) if out.exists() else 0
    assert lines < len(expected), "the stopping worker kept taking steps until the batch was done"

    cluster.start_worker(queues="steps", concurrency=16, **NO_REAPER)
    assert batch.wait(180) == 0
    total_steps = 0
    for line in assert_all_answered(out, expected).values():
        run, steps = load_run(redis_url, line["run_id"])
        assert [s.index for s in steps] == list(range(run.current_step))
        total_steps += run.current_step
    assert stub_control.stats()["completions"] == total_steps  # not one reply asked for twice


def test_steps_still_running_at_the_drain_timeout_go_back_to_the_queue(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path, redis_url: str
) -> None:
    stub_control.set_faults(latency_ms=5000)
    stopping = cluster.start_worker(queues="steps", concurrency=4, REACTQ_DRAIN_TIMEOUT_S="1", **NO_REAPER)
    questions = ["What is 17 * 23 + 4?", "What is (17 + 25) * 3?", "What is 2 to the power of 10?",
                 "What is 1234 + 5678?"]
    infile = tmp_path / "in.jsonl"
    infile.write_text("".join(json.dumps({"id": f"d{i}", "question": q}) + "\n" for i, q in enumerate(questions)))
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    wait_for("4 LLM calls in flight", lambda: stub_in_flight(stub_control), 60, until=lambda calls: calls >= 4)
    sigterm(stopping)
    stopping.wait(30)
    assert stopping.returncode == 0
    log = (cluster.logdir / "worker-0.log").read_text()
    assert "drain timeout: 4 step(s) still running went back to the queue" in log, log[-2000:]

    cluster.start_worker(queues="steps", concurrency=8, **NO_REAPER)
    assert batch.wait(180) == 0
    total_steps = 0
    for line in assert_all_answered(out, {f"d{i}": e for i, e in enumerate(["395", "126", "1024", "6912"])}).values():
        run, steps = load_run(redis_url, line["run_id"])
        assert [s.index for s in steps] == list(range(run.current_step))
        total_steps += run.current_step
    # Only the 4 calls cut off by the drain were asked again.
    assert total_steps < stub_control.stats()["completions"] <= total_steps + 4
