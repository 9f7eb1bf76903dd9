"""`reactq worker` passes options it does not know to Celery's worker: `-E --hostname x@%h` start a worker
that Celery's own `celery inspect ping` knows by that name. The webhook worker a step worker starts keeps
its own name (two workers with one node name would answer for each other)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_cluster import ROOT, Cluster, cluster_environment
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def ping(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "worker.celery_app", "inspect", "ping",
                           "--timeout", "2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.stdout


def test_unknown_options_reach_celery_and_name_the_worker(redis_url: str, tmp_path: Path) -> None:
    cluster = Cluster(cluster_environment(redis_url, "http://127.0.0.1:9/v1"), tmp_path)
    node = f"flags-test@{socket.gethostname()}"
    log = (tmp_path / "worker.log").open("wb")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "worker", "--queues", "steps", "--concurrency", "2",
             "--metrics-port", "0", "-E", "--hostname", "flags-test@%h"],
            env={**cluster.env, "REACTQ_WEBHOOK_CONCURRENCY": "1"}, stdout=log, stderr=subprocess.STDOUT,
            cwd=ROOT, start_new_session=True)
        cluster.procs.append(proc)

        def answers() -> str:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}: {(tmp_path / 'worker.log').read_text()}")
            return ping(cluster.env)

        seen = wait_for(f"{node} and the webhook worker to answer a ping", answers, 120, 1,
                        until=lambda out: node in out and "reactq-webhooks-" in out)
        assert f"reactq-steps-{proc.pid}@" not in seen  # --hostname replaced reactq's own name
        banner = (tmp_path / "worker.log").read_text()
        assert "task events: ON" in banner, banner[-3000:]  # -E
    finally:
        cluster.stop()
        log.close()


def test_celery_options_with_several_processes_are_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "worker.cli", "worker", "--processes", "2", "-E"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "need --processes 1" in done.stderr
