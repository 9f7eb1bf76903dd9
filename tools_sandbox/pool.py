"""A warm pool of ready Docker sandboxes per tier, refilled in the background.

A trivial snippet should not pay a container start (~150-350 ms): each tier keeps N
started containers whose agent waits on its stdin. An execution takes one, uses it
once and hands it back for destruction; a background thread starts a replacement.
Sandboxes are never reused, so nothing leaks between executions or tenants. When a
tier's pool is empty the caller gets a freshly started container instead of waiting.

Start-up first reaps orphans: labelled containers whose owning worker process on
this host is gone (a worker that died mid-execution).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from .docker_backend import DockerBackend, DockerSandbox
from .errors import SandboxUnavailable
from .models import Tier

log = logging.getLogger(__name__)


class WarmPool:
    """Per-tier deques of ready sandboxes; start() fills them, close() destroys them."""

    def __init__(self, backend: DockerBackend, tiers: dict[str, Tier], sizes: dict[str, int]) -> None:
        self.backend = backend
        self.tiers = tiers
        self.sizes = {name: n for name, n in sizes.items() if n > 0 and name in tiers}
        self._ready: dict[str, deque[DockerSandbox]] = {name: deque() for name in tiers}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._thread: threading.Thread | None = None
        self.reaped: list[str] = []
        self.cold_starts = 0
        self.last_error: str | None = None

    def start(self) -> None:
        """Reap orphans, then start the refill thread (fills asynchronously)."""
        self.reaped = self.backend.reap_orphans()
        if self.reaped:
            log.info("reaped %d orphaned sandbox containers", len(self.reaped))
        self._thread = threading.Thread(target=self._refill_loop, name="sandbox-pool", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until every tier's pool is full (tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if all(len(self._ready[t]) >= n for t, n in self.sizes.items()):
                    return True
            time.sleep(0.01)
        return False

    def ready_count(self, tier: str) -> int:
        with self._lock:
            return len(self._ready[tier])

    def acquire(self, tier: Tier) -> DockerSandbox:
        """A ready sandbox of `tier` (warm if available, else started now)."""
        with self._lock:
            if self._closing:
                raise SandboxUnavailable("the sandbox pool is closed")
            ready = self._ready.get(tier.name)
            sandbox = ready.popleft() if ready else None
            self._wake.notify()
        if sandbox is not None:
            return sandbox
        self.cold_starts += 1
        return self.backend.create_sandbox(tier)

    def close(self) -> None:
        """Stop refilling and destroy every idle sandbox (removal finishes in backend.close())."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._lock:
            idle = [sb for q in self._ready.values() for sb in q]
            for q in self._ready.values():
                q.clear()
        for sandbox in idle:
            self.backend.destroy(sandbox)

    def _deficit(self) -> str | None:
        for name, size in self.sizes.items():
            if len(self._ready[name]) < size:
                return name
        return None

    def _refill_loop(self) -> None:
        failures = 0
        while True:
            with self._lock:
                while not self._closing and self._deficit() is None:
                    self._wake.wait()
                if self._closing:
                    return
                name = self._deficit()
            assert name is not None
            try:
                sandbox = self.backend.create_sandbox(self.tiers[name])
            except SandboxUnavailable as exc:
                # Engine trouble: back off, callers fall back to cold starts (and see the error).
                self.last_error = str(exc)
                failures += 1
                log.warning("sandbox pool refill failed (%s); retrying", exc)
                with self._lock:
                    self._wake.wait(timeout=min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            failures = 0
            with self._lock:
                if self._closing:
                    closing = True
                else:
                    closing = False
                    self._ready[name].append(sandbox)
            if closing:
                self.backend.destroy(sandbox)
                return
