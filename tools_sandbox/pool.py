"""A warm pool of ready Docker sandboxes per tier, refilled in the background.

A trivial snippet should not pay a container start (~150-350 ms): each tier keeps N
started containers whose agent waits on its stdin. An execution takes one, uses it
once and it is destroyed; background builders start replacements. Sandboxes are never
reused, so nothing leaks between executions or tenants. When a tier's pool is empty the
caller gets a freshly started container instead of waiting.

Sustained rate: every execution costs one container build, so the pool is refilled by
several builder threads at once (the engine overlaps their create/start work), and a
tier's target size grows with its observed take rate — enough ready containers to cover
the build time at the current rate — up to `max_size`, and shrinks back when traffic
stops. A warm container unused for its tier's max idle age is replaced, so none waits
long enough for the sweeper's age cap (see sweeper.py).

Start-up first reaps orphans: labelled containers whose owning worker process on
this host is gone (a worker that died mid-execution).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque

from .docker_backend import DockerBackend, DockerSandbox
from .errors import SandboxUnavailable
from .models import Tier

log = logging.getLogger(__name__)

RATE_WINDOW_S = 10.0


class WarmPool:
    """Per-tier deques of ready sandboxes; start() fills them, close() destroys them."""

    def __init__(self, backend: DockerBackend, tiers: dict[str, Tier], sizes: dict[str, int], *,
                 builders: int = 3, max_size: int = 16, max_idle_s: float = 600.0) -> None:
        self.backend = backend
        self.tiers = tiers
        self.sizes = {name: n for name, n in sizes.items() if n > 0 and name in tiers}
        self.builders = max(1, builders)
        self.max_size = max_size
        self.max_idle_s = max_idle_s
        self._ready: dict[str, deque[DockerSandbox]] = {name: deque() for name in tiers}
        self._building: dict[str, int] = dict.fromkeys(tiers, 0)
        self._takes: dict[str, deque[float]] = {name: deque() for name in tiers}
        self._waiting: dict[str, int] = dict.fromkeys(tiers, 0)
        self._build_s = 0.3  # moving average of one container's build time
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # builders: a deficit may have appeared
        self._arrived = threading.Condition(self._lock)  # callers waiting: a sandbox is ready
        self._closing = False
        self._threads: list[threading.Thread] = []
        self.reaped: list[str] = []
        self.cold_starts = 0
        self.retired = 0
        self.last_error: str | None = None

    def start(self) -> None:
        """Reap orphans, then start the builder threads (they fill asynchronously)."""
        for name in list(self.sizes):
            try:
                self.backend.check_runtime(self.tiers[name])
            except SandboxUnavailable:
                del self.sizes[name]  # fails closed at each call instead, naming the runtime
        self.reaped = self.backend.reap_orphans()
        if self.reaped:
            log.info("reaped %d orphaned sandbox containers", len(self.reaped))
        for i in range(self.builders):
            thread = threading.Thread(target=self._refill_loop, name=f"sandbox-pool-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until every tier's pool is at its configured size (tests and benchmarks)."""
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

    def target(self, tier: str, now: float | None = None) -> int:
        """Ready containers wanted for `tier` now: the configured size, or more under load."""
        base = self.sizes.get(tier, 0)
        if base == 0:
            return 0
        now = time.monotonic() if now is None else now
        takes = self._takes[tier]
        while takes and takes[0] < now - RATE_WINDOW_S:
            takes.popleft()
        rate = len(takes) / RATE_WINDOW_S
        return min(self.max_size, max(base, math.ceil(rate * self._build_s * 1.5)))

    def acquire(self, tier: Tier, wait_s: float = 30.0) -> DockerSandbox:
        """A ready sandbox of `tier`: warm if one is ready; for a pooled tier whose builders are busy,
        the next one they finish (a queue of callers each starting a container at once only slows
        the engine down); else one started now."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            if tier.name in self._takes:
                self._takes[tier.name].append(time.monotonic())
            self._wake.notify()
            while True:
                if self._closing:
                    raise SandboxUnavailable("the sandbox pool is closed")
                ready = self._ready.get(tier.name)
                if ready:
                    return ready.popleft()
                if tier.name not in self.sizes or self._building[tier.name] == 0 or time.monotonic() >= deadline:
                    break
                self._waiting[tier.name] += 1
                self._wake.notify()
                try:
                    self._arrived.wait(timeout=deadline - time.monotonic())
                finally:
                    self._waiting[tier.name] -= 1
        self.cold_starts += 1
        return self.backend.create_sandbox(tier)

    def retire_idle(self, now: float | None = None) -> int:
        """Destroy warm sandboxes that waited longer than their tier's max idle age (replaced by builders)."""
        now = time.monotonic() if now is None else now
        stale: list[DockerSandbox] = []
        with self._lock:
            for name, ready in self._ready.items():
                limit = self._max_idle(name)
                while ready and now - ready[0].created_at > limit:
                    stale.append(ready.popleft())
            if stale:
                self._wake.notify_all()
        for sandbox in stale:
            self.backend.destroy(sandbox)
        self.retired += len(stale)
        return len(stale)

    def _max_idle(self, name: str) -> float:
        tier = self.tiers[name]
        return tier.max_idle_s if tier.max_idle_s is not None else self.max_idle_s

    def close(self) -> None:
        """Stop refilling and destroy every idle sandbox (removal finishes in backend.close())."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            self._arrived.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads = []
        with self._lock:
            idle = [sb for q in self._ready.values() for sb in q]
            for q in self._ready.values():
                q.clear()
        for sandbox in idle:
            self.backend.destroy(sandbox)

    def _deficit(self) -> str | None:
        now = time.monotonic()
        for name in self.sizes:
            if len(self._ready[name]) + self._building[name] < self.target(name, now) + self._waiting[name]:
                return name
        return None

    def _refill_loop(self) -> None:
        failures = 0
        while True:
            with self._lock:
                while not self._closing and self._deficit() is None:
                    self._wake.wait(timeout=RATE_WINDOW_S)
                if self._closing:
                    return
                name = self._deficit()
                assert name is not None
                self._building[name] += 1
            t0 = time.monotonic()
            try:
                sandbox = self.backend.create_sandbox(self.tiers[name])
            except SandboxUnavailable as exc:
                # Engine trouble (or a tier whose runtime is missing): back off; callers fall back
                # to cold starts and see the error.
                self.last_error = str(exc)
                failures += 1
                log.warning("sandbox pool refill failed (%s); retrying", exc)
                with self._lock:
                    self._building[name] -= 1
                    self._wake.wait(timeout=min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            failures = 0
            with self._lock:
                self._building[name] -= 1
                self._build_s = 0.8 * self._build_s + 0.2 * (time.monotonic() - t0)
                closing = self._closing
                if not closing:
                    self._ready[name].append(sandbox)
                    self._arrived.notify()
            if closing:
                self.backend.destroy(sandbox)
                return
