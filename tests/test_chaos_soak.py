"""A small chaos soak (tests/chaos.py; bench/chaos_soak.py runs thousands): a flaky provider, step workers
SIGKILLed and replaced, Redis SIGKILLed and restarted twice (its last second of writes lost), `reactq batch`
resumed as a user would, and every run still ends with its right answer; and what the soak found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from celery import Celery

from tests.chaos import SoakConfig, soak
from tests.fixtures_cluster import ROOT
from tests.harness import Harness, call, final
from worker.core.outcome import Outcome
from worker.names import SANDBOX_QUEUE, SANDBOX_TASK, queue_lists
from worker.runtime.reaper import reap_once
from worker.store import keys as worker_keys


@pytest.mark.docker
@pytest.mark.integration
def test_chaos_soak_loses_no_run_and_answers_each_right(sandbox_image: str, tmp_path: Path) -> None:
    # slow calls and few threads, so that a few worker kills fall inside the batch even on a quiet machine
    config = SoakConfig(runs=200, concurrency=4, latency_ms=500, latency_jitter_ms=200, kill_every_s=8.0)
    report = soak(config, tmp_path, sandbox_image)
    print(json.dumps(report.summary(), indent=1))  # the figures, with -s
    kinds = [f.kind for f in report.faults]
    assert kinds.count("redis") == 2 and kinds.count("worker") >= 1, report.faults
    assert report.by_status.get("500") and report.by_status.get("429"), report.by_status
    assert report.python_runs > 0
    assert report.lost == [], (report.lost[:20], report.invocations)
    assert report.wrong == [], report.wrong[:5]
    assert report.duplicate_lines == 0


def test_a_sandbox_call_lost_with_redis_writes_is_sent_again_without_waiting_out_the_redispatch_time(
        harness: Harness, redis_url: str) -> None:
    """Found by the soak: Redis that lost its last second of writes had lost a python call's result, its
    ack and the next step's message; the run (waiting on the sandbox, its dispatch mark still set) sat
    until REACTQ_SANDBOX_REDISPATCH_AFTER_S (300 s). Now the reaper sends the call again once no message
    for it is queued or held in two passes in a row, as it does for a lost step message."""
    harness.llm.script(call("python", {"code": "print(6*7)"}), final("42"))
    run_id = harness.submit("Use python to compute 6 * 7", tier="pro", tenant="acme")
    assert harness.drain() == [Outcome.WAITING]
    [sent] = harness.dispatch.sandbox
    client = redis.Redis.from_url(redis_url)
    producer = Celery("chaos-soak-test", broker=redis_url)
    producer.send_task(SANDBOX_TASK, args=[sent], queue=SANDBOX_QUEUE)  # the real message, as the runner sends it
    later = time.time() + harness.rt.settings.stale_after_s + 1  # well before the redispatch time

    def reap() -> list[str]:
        client.delete(worker_keys.REAPER_LOCK)
        return reap_once(harness.rt, harness.dispatch.as_dispatcher(), now=later)

    try:
        assert reap() == [] and reap() == [] and reap() == []  # its message waits in the queue: left alone
        client.delete(*queue_lists(SANDBOX_QUEUE))  # lost with the last second of writes
        assert reap() == []  # the first miss only makes it a suspect
        assert reap() == [run_id]
        assert not client.exists(worker_keys.sandbox_dispatch(run_id, 0, "c1"))
        assert harness.drain() == [Outcome.WAITING]  # the re-run step sends the call again
        assert len(harness.dispatch.sandbox) == 2 and harness.dispatch.sandbox[1]["result_key"] == sent["result_key"]
    finally:
        producer.close()
        client.close()


WARMED = """
from celery import signals
from worker.tasks import steps
app = steps.app
signals.worker_init.send(sender=None)
assert app._pool is not None and app.amqp._producer_pool is not None, "no pool made at worker_init"
print(app.pool.limit, app.amqp.producer_pool.limit)
"""


def test_a_worker_makes_its_broker_pools_before_its_first_tasks(redis_url: str) -> None:
    """Found by the soak: a fresh worker taking a backlog made Celery's pools lazily from several threads at
    once, and one step failed with "Can't shrink pool when in use: was=512 now=10". The pools are made
    at worker_init, in one thread, at the configured size."""
    done = subprocess.run([sys.executable, "-c", WARMED], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "REACTQ_REDIS_URL": redis_url, "REACTQ_REDIS_MAX_CONNECTIONS": "64"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["64", "64"]
