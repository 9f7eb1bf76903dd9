"""`celery -A worker.celery_app worker`, started with no options, is the same worker as `reactq worker`
(worker/tasks/worker_setup.py): what Celery's own CLI (`inspect active_queues`, `inspect stats`) says of
the two, side by side, on the test's redis-server; its /metrics, JSON logs, webhook worker and a real run
against the api_stub. Celery's own options win over those defaults either way it is started."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_receiver import Receiver
from tests.fixtures_services import free_port
from tests.test_webhooks import webhook_workers_of
from tests.waiting import wait_for
from worker.names import SANDBOX_QUEUE, STEPS_QUEUE, WEBHOOKS_QUEUE
from worker.store import keys
from worker.tasks.worker_setup import STEP_THREADS, default_concurrency, split_webhooks

HOST = socket.gethostname()
THREADS = "celery.concurrency.thread:TaskPool"


# --- pure --------------------------------------------------------------------------------------

def test_webhooks_get_a_worker_of_their_own_beside_other_queues() -> None:
    assert split_webhooks([STEPS_QUEUE, SANDBOX_QUEUE], 8) == ([STEPS_QUEUE, SANDBOX_QUEUE], True)
    assert split_webhooks([STEPS_QUEUE], 0) == ([STEPS_QUEUE], False)  # REACTQ_WEBHOOK_CONCURRENCY=0: none
    assert split_webhooks([SANDBOX_QUEUE, WEBHOOKS_QUEUE], 0) == ([SANDBOX_QUEUE], True)
    assert split_webhooks([SANDBOX_QUEUE], 8) == ([SANDBOX_QUEUE], False)
    assert split_webhooks([WEBHOOKS_QUEUE], 8) == ([WEBHOOKS_QUEUE], False)  # the webhook worker itself


def test_threads_follow_the_queues_when_c_is_not_given() -> None:
    assert default_concurrency([STEPS_QUEUE, SANDBOX_QUEUE], 8) == STEP_THREADS
    assert default_concurrency([WEBHOOKS_QUEUE], 5) == 5
    assert default_concurrency([SANDBOX_QUEUE], 8) >= 1


def test_importing_the_app_sets_up_no_worker() -> None:
    """The API, the CLI and tests import the app: the worker set-up is only in the app's `include`."""
    done = subprocess.run([sys.executable, "-c", "import sys, threading, worker.celery_app; "
                           "print('worker.tasks.worker_setup' in sys.modules, threading.active_count())"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "1"], done.stdout + done.stderr


@pytest.mark.parametrize(("queue", "loaded"), [(STEPS_QUEUE, "True 1"), (SANDBOX_QUEUE, "False 0")])
def test_a_step_worker_loads_the_model_client_as_it_starts(queue: str, loaded: str) -> None:
    """A worker that calls models imports openai and builds its TLS context before its pool runs a task (its
    first steps would otherwise all wait for that import); a sandbox worker does without."""
    done = subprocess.run([sys.executable, "-c", "import sys; from worker.tasks import worker_setup as w; "
                           "from worker.llm.http_pool import shared_ssl_context as tls; "
                           "assert 'openai' not in sys.modules; "
                           f"w._started['queues'] = [{queue!r}]; w._load_task_code(); "
                           "print('openai' in sys.modules, tls.cache_info().currsize)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == loaded, done.stdout + done.stderr


# --- real workers ------------------------------------------------------------------------------

def inspect(env: dict[str, str], what: str) -> dict[str, Any]:
    """`celery -A worker.celery_app inspect WHAT --json`: each node's answer ({} while none answers)."""
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "worker.celery_app", "inspect", what, "--json",
                           "--timeout", "3"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}


def start(cluster: Cluster, argv: list[str], name: str, **extra_env: str) -> subprocess.Popen[bytes]:
    """A worker process of this cluster (stopped with its process group, webhook worker included);
    stdout and stderr in separate files under the test's tmp dir."""
    proc = subprocess.Popen(argv, env={**cluster.env, **extra_env}, cwd=ROOT, start_new_session=True,
                            stdout=(cluster.logdir / f"{name}.out").open("wb"),
                            stderr=(cluster.logdir / f"{name}.err").open("wb"))
    cluster.procs.append(proc)
    return proc


def celery_worker(cluster: Cluster, *options: str, name: str = "celery", **extra_env: str) -> subprocess.Popen[bytes]:
    return start(cluster, [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker", *options], name,
                 **extra_env)


def reactq_worker(cluster: Cluster, *options: str, name: str = "reactq", **extra_env: str) -> subprocess.Popen[bytes]:
    return start(cluster, [sys.executable, "-m", "worker.cli", "worker", *options], name, **extra_env)


def nodes(cluster: Cluster, wanted: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """`inspect stats` once `wanted` holds of it; raises at once when a worker of the cluster exited."""
    def stats() -> dict[str, Any]:
        for proc in cluster.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited with {proc.returncode}; logs in {cluster.logdir}")
        return inspect(cluster.env, "stats")

    return wait_for(what, stats, 180, 1, until=wanted)


def webhook_node_of(found: dict[str, Any], proc: subprocess.Popen[bytes]) -> str:
    """The node name of the one webhook worker `proc` started (reactq-webhooks-<its pid>@host)."""
    [child] = webhook_workers_of(proc)
    name = f"reactq-webhooks-{child}@{HOST}"
    assert name in found, sorted(found)
    return name


def queues_of(answers: dict[str, Any], node: str) -> set[str]:
    return {q["name"] for q in answers[node]}


def pool_of(stats: dict[str, Any], node: str) -> tuple[str, int]:
    return stats[node]["pool"]["implementation"], stats[node]["pool"]["max-concurrency"]


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


@pytest.mark.integration
def test_a_plain_celery_worker_is_configured_like_reactq_worker(
        cluster: Cluster, make_receiver: Callable[..., Receiver]) -> None:
    receiver = make_receiver(0)
    cluster.env["REACTQ_WEBHOOK_ALLOW_PRIVATE"] = "1"  # the receiver is on loopback
    plain_port, reactq_port = free_port(), free_port()
    # No options: what it does comes from the app's settings and signals, and REACTQ_* as for `reactq worker`.
    # (CELERY_WORKER_LOGLEVEL is Celery's own spelling of -l; Celery's default level is WARNING.)
    plain = celery_worker(cluster, REACTQ_METRICS_PORT=str(plain_port), CELERY_WORKER_LOGLEVEL="INFO")
    plain_node = f"celery@{HOST}"
    found = nodes(cluster, lambda n: plain_node in n and len(n) == 2, "the plain worker and its webhook worker")
    plain_hooks = webhook_node_of(found, plain)
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    member = f"{HOST}:{plain.pid}"
    wait_for("the plain worker's heartbeats", lambda: [client.zscore(keys.workers(q), member)
                                                       for q in (STEPS_QUEUE, SANDBOX_QUEUE)], until=all)
    client.close()

    # A real run, end to end: the plain worker is the only step worker, its webhook worker the only webhook one.
    assert cluster.reactq("webhook", "set-default", "default", receiver.url).returncode == 0
    done = cluster.reactq("ask", "What is 6 * 7?", "--wait", "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["status"] == "succeeded" and run["answer"] == "42", run
    [call] = receiver.wait_for("the run's webhook", lambda calls: len(calls) >= 1)
    assert call.headers["x-reactq-event"] == "run.finished" and json.loads(call.body)["run_id"] == run["run_id"]

    scraped = httpx.get(f"http://127.0.0.1:{plain_port}/metrics", timeout=10).text
    assert 'reactq_runs_total{status="succeeded"} 1.0' in scraped
    assert "reactq_llm_requests_total{" in scraped and "reactq_steps_total{" in scraped
    logged = json_lines(cluster.logdir / "celery.err")
    assert any(line["msg"] == f"{plain_node} ready." and line["logger"] == "celery.apps.worker" for line in logged)
    assert any(line.get("run_id") == run["run_id"] for line in logged), logged[-20:]  # bound by task_prerun
    assert sum(f":{plain_port}/metrics" in line["msg"] for line in logged) == 1

    # `reactq worker` with its defaults, beside it: the same queues, pool and threads, per Celery's CLI.
    wrapped = reactq_worker(cluster, "--metrics-port", str(reactq_port))
    wrapped_node = f"reactq-steps-sandbox-{wrapped.pid}@{HOST}"
    stats = nodes(cluster, lambda n: wrapped_node in n and len(n) == 4, "both workers and their webhook workers")
    wrapped_hooks = webhook_node_of(stats, wrapped)
    active = inspect(cluster.env, "active_queues")
    assert queues_of(active, plain_node) == queues_of(active, wrapped_node) == {STEPS_QUEUE, SANDBOX_QUEUE}
    assert queues_of(active, plain_hooks) == queues_of(active, wrapped_hooks) == {WEBHOOKS_QUEUE}
    assert pool_of(stats, plain_node) == pool_of(stats, wrapped_node) == (THREADS, STEP_THREADS)
    assert pool_of(stats, plain_hooks) == pool_of(stats, wrapped_hooks) == (THREADS, 8)
    assert stats[plain_node]["prefetch_count"] == stats[wrapped_node]["prefetch_count"] == STEP_THREADS

    # Exactly one metrics server and one webhook worker for `reactq worker` (the wrapper starts neither
    # itself now: worker_init does, once, before the node answers `inspect`); the webhook worker serves no
    # /metrics.
    assert "reactq_steps_total" in httpx.get(f"http://127.0.0.1:{reactq_port}/metrics", timeout=10).text
    assert len(webhook_workers_of(wrapped)) == 1 and len(webhook_workers_of(plain)) == 1
    wrapped_log = json_lines(cluster.logdir / "reactq.err")
    assert sum("/metrics" in line["msg"] for line in wrapped_log) == 1, [x["msg"] for x in wrapped_log]
    assert not any("unavailable" in line["msg"] for line in wrapped_log + logged)


@pytest.mark.integration
def test_celery_options_win_over_the_defaults_either_way(cluster: Cluster) -> None:
    # Plain Celery: -Q with webhooks beside another queue (they go to a webhook worker of their own), -c, -E,
    # --hostname, --max-memory-per-child (accepted; Celery applies it to prefork children only).
    plain = celery_worker(cluster, "-Q", f"{SANDBOX_QUEUE},{WEBHOOKS_QUEUE}", "-c", "3", "-E",
                          "--hostname", "plain-flags@%h", "--max-memory-per-child", "400000")
    # Through `reactq worker`: Celery's -Q (after the one reactq passes for its default --queues), -P and
    # --hostname.
    wrapped = reactq_worker(cluster, "-Q", STEPS_QUEUE, "-P", "solo", "--hostname", "wrapped-flags@%h")
    plain_node, wrapped_node = f"plain-flags@{HOST}", f"wrapped-flags@{HOST}"
    stats = nodes(cluster, lambda n: {plain_node, wrapped_node} <= set(n) and len(n) == 4, "the four workers")
    active = inspect(cluster.env, "active_queues")
    assert queues_of(active, plain_node) == {SANDBOX_QUEUE}
    assert pool_of(stats, plain_node) == (THREADS, 3)
    assert queues_of(active, webhook_node_of(stats, plain)) == {WEBHOOKS_QUEUE}
    assert queues_of(active, wrapped_node) == {STEPS_QUEUE}
    assert pool_of(stats, wrapped_node) == ("celery.concurrency.solo:TaskPool", 1)
    assert queues_of(active, webhook_node_of(stats, wrapped)) == {WEBHOOKS_QUEUE}
    assert "task events: ON" in (cluster.logdir / "celery.out").read_text()
    assert "task events: OFF" in (cluster.logdir / "reactq.out").read_text()
