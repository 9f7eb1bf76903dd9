"""A process's own small HTTP listener: /metrics, and for a worker the orchestrator's probes.

A `reactq worker` is one process running a Celery threads pool, so the default prometheus-client
registry already holds every thread's figures: no multiprocess mode is needed (or used). The listener
binds REACTQ_METRICS_HOST (127.0.0.1 unless a manifest says otherwise: Prometheus scrapes pods).

A worker's listener also answers
- `/livez`: 200 while the Celery consumer loop is alive, i.e. Celery's worker heartbeat (a timer of the
  consumer's event loop, every 2 s; worker/tasks/health.py records it) fired within
  REACTQ_HEALTH_STALE_S. Also 200 while the worker starts, drains, or waits for an unreachable Redis:
  a restart would not help then. 503 only when Redis answers and the loop has not beaten for that long.
- `/readyz`: 200 when the consumer is consuming and not shutting down, Redis answers a PING, and a
  worker of the sandbox queue has a backend that can run code.

The API serves the same /metrics page on a port of its own (REACTQ_API_METRICS_PORT, see
`start_api_metrics_server`), never on the port its clients reach.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from .. import metrics
from ..core.engine import ENGINE_ERROR_KINDS
from ..core.parser import PARSE_ERROR_KINDS
from ..errors import StoreUnavailable
from ..names import SANDBOX_QUEUE
from ..store.connection import ping_quickly
from ..tenancy.plans import known_tiers
from .context import Runtime
from .host_names import AllowedHosts

log = logging.getLogger("reactq.metrics")

Check = Callable[[], tuple[bool, str]]


def initialise(rt: Runtime) -> None:
    metrics.initialise(rt.settings.model, rt.settings.tenants, rt.tools.names(),
                       (*PARSE_ERROR_KINDS, *ENGINE_ERROR_KINDS, "loop"))
    try:
        from tools_sandbox.base.metrics import init_labels as init_sandbox
    except ImportError:  # a step-only host without tools_sandbox
        return
    init_sandbox(known_tiers(rt.settings), rt.settings.tenants)


def refresh_cluster_gauges(rt: Runtime) -> None:
    """The API's scrape-time figures: queue depths and runs in progress, read from Redis."""
    try:
        for queue, depth in rt.cluster.queue_depths().items():
            metrics.QUEUE_DEPTH.labels(queue).set(depth)
        metrics.RUNS_IN_PROGRESS.set(rt.cluster.active_count())
    except Exception:  # noqa: BLE001 - Redis down: still serve the counters this process has
        pass


class WorkerHealth:
    """What the probes read: the consumer's heartbeats, its queues, whether it is shutting down."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._born = clock()
        self._beat: float | None = None
        self._queues: tuple[str, ...] = ()
        self._stopping = False

    def beat(self) -> None:
        self._beat = self._clock()

    def consuming(self, queues: Iterable[str]) -> None:
        self._queues = tuple(queues)
        self.beat()

    def stopping(self) -> None:
        self._stopping = True

    def _age(self) -> float:
        return self._clock() - (self._born if self._beat is None else self._beat)

    def live(self, stale_s: float, redis_up: Callable[[], bool]) -> tuple[bool, str]:
        if self._stopping:
            return True, "shutting down"
        if self._age() <= stale_s:
            return True, "consumer alive" if self._beat is not None else "starting"
        if not redis_up():
            return True, "waiting for Redis"
        return False, f"no consumer heartbeat for {self._age():.0f} s while Redis answers"

    def ready(self, stale_s: float, redis_up: Callable[[], bool]) -> tuple[bool, str]:
        if self._stopping:
            return False, "shutting down"
        if self._beat is None or not self._queues:
            return False, "the consumer has not started"
        if self._age() > stale_s:
            return False, f"no consumer heartbeat for {self._age():.0f} s"
        if not redis_up():
            return False, "Redis is unreachable"
        if SANDBOX_QUEUE in self._queues:
            from tools_sandbox import backend_up

            if not backend_up():
                return False, "the sandbox backend cannot run code"
        return True, "ready"


HEALTH = WorkerHealth()  # this process's; fed by worker/tasks/health.py


def _redis_up(url: str) -> Callable[[], bool]:
    def up() -> bool:
        try:
            ping_quickly(url)
        except StoreUnavailable:
            return False
        return True

    return up


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


def _wsgi_app(collect: Callable[[], None] | None, probes: dict[str, Check],
              hosts: AllowedHosts | None = None) -> Callable[..., Iterator[bytes]]:
    exposition = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        path = environ.get("PATH_INFO", "")
        if hosts is not None and not hosts.allows(environ.get("HTTP_HOST")):
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            yield b"unknown host: this listener answers only to REACTQ_API_ALLOWED_HOSTS and IP addresses\n"
            return
        if path == "/metrics":
            if collect is not None:
                collect()
            yield from exposition(environ, start_response)
            return
        if path in probes:
            ok, why = probes[path]()
            status = "200 OK" if ok else "503 Service Unavailable"
        else:
            status, why = "404 Not Found", "not found: /metrics" + "".join(f", {p}" for p in probes)
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        yield (why + "\n").encode()

    return app


def serve(host: str, port: int, collect: Callable[[], None] | None = None,
          probes: dict[str, Check] | None = None, hosts: AllowedHosts | None = None) -> WSGIServer:
    """Serve /metrics (and `probes`, path -> check) on host:port from a daemon thread; with `hosts`, a
    request naming another Host answers 400."""
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, port, _wsgi_app(collect, probes or {}, hosts), server_class, _Quiet)
    threading.Thread(target=server.serve_forever, name="reactq-metrics", daemon=True).start()
    return server


def start_metrics_server(port: int, rt: Runtime, health: WorkerHealth = HEALTH) -> bool:
    """A worker's listener: /metrics, /livez, /readyz."""
    initialise(rt)
    s = rt.settings
    up = _redis_up(s.redis_url)
    probes: dict[str, Check] = {"/livez": lambda: health.live(s.health_stale_s, up),
                                "/readyz": lambda: health.ready(s.health_stale_s, up)}
    return _start(s.metrics_host, port, None, probes)


def start_api_metrics_server(port: int, rt: Runtime) -> bool:
    """The API's /metrics (tenants, spend), on a port of its own (initialised by the app's lifespan), for
    the API's names and any IP address (Prometheus scrapes pods by IP): never a re-pointed name."""
    hosts = AllowedHosts(rt.settings.api_allowed_hosts, addresses=True)
    return _start(rt.settings.metrics_host, port, lambda: refresh_cluster_gauges(rt), {}, hosts)


def _start(host: str, port: int, collect: Callable[[], None] | None, probes: dict[str, Check],
           hosts: AllowedHosts | None = None) -> bool:
    try:
        serve(host, port, collect, probes, hosts)
    except OSError as exc:
        log.warning("metrics port %s:%s unavailable (%s); this process exports no /metrics", host, port, exc)
        return False
    log.info("metrics on %s:%s/metrics", host, port)
    return True
