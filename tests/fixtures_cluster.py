"""A real reactq cluster for integration tests: `reactq worker` processes (Celery, threads pool) on the
test's redis-server, talking to the test's api_stub over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.fixtures_services import free_port
from tests.waiting import WaitTimeout, wait_for
from worker.config import Settings, cluster_seed_url, is_cluster_url
from worker.core.models import Run
from worker.core.views import run_json
from worker.store import keys
from worker.store.runs import RunStore

ROOT = Path(__file__).resolve().parent.parent


def state_client(url: str) -> redis.Redis:
    """A client of the runs' state: a Redis Cluster's for a redis+cluster:// URL."""
    if is_cluster_url(url):
        return redis.RedisCluster.from_url(cluster_seed_url(url))  # type: ignore[return-value]
    return redis.Redis.from_url(url)


@dataclass
class Cluster:
    """Environment for the reactq processes of one test, and the worker processes started for it."""

    env: dict[str, str]
    logdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    graceful: set[int] = field(default_factory=set)  # pids to stop with SIGTERM (their containers go with them)
    stopped: set[int] = field(default_factory=set)  # pids the test stopped on purpose (`kill`)

    def start_worker(self, queues: str = "steps,sandbox", concurrency: int = 32,
                     metrics_port: int = 0, **extra_env: str) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"worker-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "worker", "--queues", queues, "--concurrency", str(concurrency),
             "--metrics-port", str(metrics_port)],
            env={**self.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True,
        )
        self.procs.append(proc)
        if {**self.env, **extra_env}.get("REACTQ_SANDBOX_BACKEND") == "docker":
            self.graceful.add(proc.pid)
        client = state_client(self.env["REACTQ_REDIS_URL"])
        wanted = [keys.workers(f"reactq.{q.strip()}") for q in queues.split(",")]

        def heartbeats() -> list[int]:
            """Workers heartbeat into Redis once Celery is consuming; while none does, a worker that exited
            fails the wait at once."""
            beats = [client.zcount(k, time.time() - 30, "+inf") for k in wanted]
            if not all(beats):
                for started in self.procs:
                    if started.poll() is not None and started.pid not in self.stopped:
                        raise RuntimeError(f"worker exited with {started.returncode}; logs in {self.logdir}")
            return beats

        wait_for(f"a worker consuming {queues} (logs in {self.logdir})", heartbeats, until=all)
        client.close()
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        """What one of this cluster's workers has logged so far."""
        return (self.logdir / f"worker-{self.procs.index(proc)}.log").read_text(errors="replace")

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.stopped.add(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def reactq(self, *args: str, check: bool = False, timeout: float = 300,
               **extra_env: str) -> subprocess.CompletedProcess[str]:
        """Run the real `reactq` CLI against this cluster."""
        return subprocess.run(
            [sys.executable, "-m", "worker.cli", *args], env={**self.env, **extra_env}, cwd=ROOT,
            capture_output=True, text=True, timeout=timeout, check=check,
        )

    def start_batch(self, infile: Path, out: Path) -> subprocess.Popen[str]:
        """`reactq batch` in the background (stderr captured), for tests that act while it runs."""
        return subprocess.Popen([sys.executable, "-m", "worker.cli", "batch", str(infile), "--out", str(out)],
                                env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)

    def finish_batch(self, batch: subprocess.Popen[str], timeout: float = 240) -> str:
        """Wait for a `start_batch` process to exit and return its stderr; raises at once, naming the worker
        and the end of its log, when one of this cluster's workers has died meanwhile (the batch would
        otherwise wait out its whole timeout for a worker that is gone)."""
        errors: list[str] = []
        reader = threading.Thread(target=lambda: errors.append(batch.stderr.read() if batch.stderr else ""),
                                  daemon=True)  # drained all along, so a full pipe never blocks the batch
        reader.start()

        def exit_code() -> int | None:
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None and proc.pid not in self.stopped:
                    raise RuntimeError(f"worker-{i} exited with {proc.returncode} while the batch ran; "
                                       f"its log ends:\n{self.log(proc)[-3000:]}")
            return batch.poll()

        try:
            wait_for(f"the batch to finish (logs in {self.logdir})", exit_code, timeout, 0.2,
                     until=lambda code: code is not None)
        except (RuntimeError, WaitTimeout):
            batch.kill()
            batch.wait(10)
            raise
        reader.join(10)
        return "".join(errors)

    @staticmethod
    def wait_for_results(out: Path, count: int, timeout: float = 120) -> None:
        """Until `count` result lines are in `out`; raises naming the file and what it held."""

        wait_for(f"{count} result lines in {out}", lambda: len(out.read_text().splitlines()) if out.exists() else 0,
                 timeout, until=lambda lines: lines >= count)

    def settings(self) -> Settings:
        """The settings this cluster's processes read from their environment, for in-process use."""
        saved = {k: v for k, v in os.environ.items() if k.startswith("REACTQ_")}
        try:
            for name in saved:
                del os.environ[name]
            os.environ.update({k: v for k, v in self.env.items() if k.startswith("REACTQ_")})
            return Settings()
        finally:
            for name in [k for k in os.environ if k.startswith("REACTQ_")]:
                del os.environ[name]
            os.environ.update(saved)

    def load_run(self, run_id: str) -> Run | None:
        """The run's record as Redis holds it (read in-process: cheap enough to poll)."""
        client = state_client(self.env["REACTQ_REDIS_URL"])
        try:
            return RunStore(client).load_run(run_id)
        finally:
            client.close()

    def run_status(self, run_id: str) -> str | None:
        run = self.load_run(run_id)
        return None if run is None else run.status.value

    def wait_for_status(self, run_id: str, wanted: Callable[[str | None], bool], what: str,
                        timeout: float = 120) -> dict:
        """Poll the run's record until `wanted(status)` holds, then return what `reactq status --json` prints
        (built in-process by the same function; a CLI process costs about half a CPU second, and the CLI's
        own output is checked where it is under test); raises naming `what` on timeout."""
        wait_for(f"run {run_id} {what}", lambda: self.run_status(run_id), timeout, until=wanted)
        run = self.load_run(run_id)
        assert run is not None, f"run {run_id} vanished"
        return json.loads(json.dumps(run_json(run)))

    def wait_for_run(self, run_id: str, timeout: float = 120) -> dict:
        """Until the run has ended; returns its `reactq status --json` object, raises on timeout."""
        return self.wait_for_status(run_id, lambda s: s not in (None, "queued", "running", "awaiting_approval"),
                                    "to end", timeout)

    def stop(self) -> None:
        """After the test: SIGKILL, since a graceful stop takes a worker up to ~3.5 s and is what
        tests/test_shutdown.py checks, not every test; workers with Docker sandboxes get SIGTERM, so that
        they remove their warm containers."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM if proc.pid in self.graceful else signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def cluster_environment(redis_url: str, stub_base_url: str) -> dict[str, str]:
    """The environment of a test cluster's processes: this Redis, this stub, short recovery timings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTQ_")}
    env.update({
        "REACTQ_REDIS_URL": redis_url,
        "REACTQ_LLM_BASE_URL": stub_base_url,
        "REACTQ_SANDBOX_BACKEND": os.environ.get("REACTQ_TEST_SANDBOX_BACKEND", "process"),
        "REACTQ_STALE_AFTER_S": "4",
        "REACTQ_REAPER_INTERVAL_S": "1",
        "REACTQ_LEASE_TTL_S": "3",
        "REACTQ_LLM_TIMEOUT_S": "30",  # far above the stub latencies the tests set, even on a loaded machine
        "REACTQ_TENANTS": '["default", "acme"]',
        "REACTQ_METRICS_PORT": "0",
        "PYTHONUNBUFFERED": "1",
    })
    return env


@pytest.fixture
def cluster_env(redis_url: str, stub_base_url: str) -> dict[str, str]:
    return cluster_environment(redis_url, stub_base_url)


@pytest.fixture
def cluster(cluster_env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(cluster_env, tmp_path)
    yield c
    c.stop()


def metrics_port() -> int:
    return free_port()


def wait_until(condition: Callable[[], bool], what: str, timeout: float, interval: float = 0.1) -> None:
    """The older spelling of tests.waiting.wait_for, still imported by tests/test_tenancy.py."""
    wait_for(what, condition, timeout, interval)
