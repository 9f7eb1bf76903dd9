"""The warm pool: started sandboxes per tier, and sandboxes bound to one (tenant, tier) that serve again.

A trivial snippet should not pay a container start (~150-350 ms). Each tier keeps a few
started, *unbound* containers, refilled in the background by several builder threads (the
engine overlaps their create/start work); the target grows with the observed rate of
first uses, up to `max_size`, and shrinks back when traffic stops.

A tenant's execution takes, in this order: an idle container already bound to it on that
tier (the most recently used: its pages are warm); the next of its containers to come back from
the cleanup after a call that returned (milliseconds: see PooledDocker); while the tenant's other
callers hold or are getting containers and the first of those is expected to come free within a
container's build time (`waits_for_own`), the next of those to come free (up to four builds' time, counted
from when the tenant's first container is handed out: its callers arriving together wait for the
one the first of them is getting, however long that build takes); else an unbound one, which it
binds for the container's whole life; else the next one a builder finishes; else one started now.
It never takes a container bound to another tenant. After a clean execution the container goes
back to the tenant's idle set, unless it reached its tier's `max_executions` or `max_age_s`;
after any anomaly the backend has already retired it.

Bounds: a tenant keeps as many idle containers as it recently had executions at once (its
observed concurrency over the last `RATE_WINDOW_S` x 3), and a worker keeps at most
`max_bound` idle bound containers in all, evicting the least recently used. Idle
containers unused for their tier's max idle age are retired, so none waits long enough for
the sweeper's age cap (see base/sweeper.py). Start-up first reaps orphans: labelled containers
whose owning worker process on this host is gone (a worker that died mid-execution).

Containers can vanish under the pool (an operator's `docker rm -f`, a prune, an engine restart).
A container is checked before it is handed out (its init and its attach stream, in microseconds)
and a dead one is dropped (`gone`); one lost during an execution (`lost`) is the host's trouble,
not the program's: the call runs again in another container, up to `RUNS_PER_CALL` times.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from ..base.errors import SandboxUnavailable
from ..base.metrics import RETIRED, WARM
from ..base.models import ErrorKind, ReapReason, SandboxResult, Tier
from ..base.sweeper import SweepPolicy
from .docker_backend import CLEANUP_TIMEOUT_S, DockerBackend, DockerSandbox
from .frames import Demux

log = logging.getLogger(__name__)

RATE_WINDOW_S = 10.0
# Containers one call may use when they are lost under it (see PooledDocker.execute).
RUNS_PER_CALL = 3
# Threads reading the ready records of containers whose programs have exited (see PooledDocker), started as
# needed. Many: a cleanup may take up to CLEANUP_TIMEOUT_S (a program that left many files), and one tenant's
# slow cleanups (at most its concurrent executions) must not hold back the return of another's containers.
SETTLERS = 64
Key = tuple[str, str]  # (tenant, tier)


# How long, in container builds, a caller may wait for its tenant's containers to come free before it takes
# another. A tenant's callers queue behind its containers: on a saturated 2-core machine four callers behind
# one container (holds of ~0.3 s) wait ~0.9 s, past two builds, and each such start cost the machine 0.1-0.3 s
# of CPU while the wait would have cost none (BENCHMARKS.md, 2026-12-07, fourth session).
OWN_WAIT_BUILDS = 4


def waits_for_own(hold_s: float, held: int, build_s: float) -> bool:
    """Whether a caller of a tenant with `held` containers out (or others of its callers getting one) waits
    for the first of them to come free rather than take another. With their remaining times spread over a
    hold (`hold_s`, the moving average), the first comes free in about hold_s / (held + 1). Another
    container costs a build (`build_s`) even when a warm one is ready: the pool starts its replacement, and
    a start is the dearest thing the engine does (0.1-0.3 s of the machine's CPU on runc under load, against
    a few ms for an execution: BENCHMARKS.md). So it waits when the first is expected within a build."""
    return hold_s / (held + 1) < build_s


def _count_in(counts: dict[Key, int], key: Key, delta: int) -> int:
    """Add `delta` to `key`'s count, which leaves the dict at zero; the new count."""
    count = counts.get(key, 0) + delta
    if count > 0:
        counts[key] = count
    else:
        counts.pop(key, None)
    return count


@dataclass(frozen=True)
class Limits:
    """When a bound container retires, and how many the pool keeps."""

    max_size: int = 16  # unbound warm containers per tier, at most
    max_idle_s: float = 600.0
    max_age_s: float = 600.0
    max_executions: int = 200
    max_bound: int = 32  # idle bound containers per worker, at most


class WarmPool:
    """Unbound and bound warm sandboxes; start() fills them, close() destroys them."""

    def __init__(self, backend: DockerBackend, tiers: dict[str, Tier], sizes: dict[str, int], *,
                 builders: int = 3, limits: Limits | None = None) -> None:
        self.backend = backend
        self.tiers = tiers
        self.sizes = {name: n for name, n in sizes.items() if n > 0 and name in tiers}
        self.builders = max(1, builders)
        self.limits = limits or Limits()
        self._ready: dict[str, deque[DockerSandbox]] = {name: deque() for name in tiers}
        self._idle: OrderedDict[str, DockerSandbox] = OrderedDict()  # bound, by container id, LRU first
        self._busy: dict[Key, int] = {}
        self._concurrency: dict[Key, deque[tuple[float, int]]] = {}
        self._building: dict[str, int] = dict.fromkeys(tiers, 0)
        self._takes: dict[str, deque[float]] = {name: deque() for name in tiers}
        self._waiting: dict[str, int] = dict.fromkeys(tiers, 0)
        self._build_s = 0.3  # moving average of one container's build time
        self._held: dict[Key, int] = {}  # containers out with a caller, per (tenant, tier)
        self._seeking: dict[Key, int] = {}  # callers waiting for a builder or starting a container, per (tenant, tier)
        self._cleaning: dict[str, Key] = {}  # containers whose call returned, until their cleanup is read
        self._hold_s = 0.05  # moving average of how long a caller keeps a container
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # builders: a deficit may have appeared
        self._arrived = threading.Condition(self._lock)  # callers waiting: a sandbox is ready
        self._closing = False
        self._threads: list[threading.Thread] = []
        self.reaped: list[str] = []
        self.cold_starts = 0
        self.reuses = 0
        self.retired: dict[str, int] = {}

    def start(self) -> None:
        """Reap orphans, then start the builder threads (they fill asynchronously)."""
        for name in list(self.sizes):
            try:
                self.backend.check_runtime(self.tiers[name])
            except SandboxUnavailable:
                del self.sizes[name]  # fails closed at each call instead, naming the runtime
        for name in self.tiers:
            WARM.labels(tier=name, state="unbound").set_function(partial(self._warm_count, name, bound=False))
            WARM.labels(tier=name, state="bound").set_function(partial(self._warm_count, name, bound=True))
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

    def _warm_count(self, tier: str, *, bound: bool) -> int:
        """Idle containers of `tier`: bound to a tenant, or not yet (the gauge reactq_sandbox_warm_containers)."""
        with self._lock:
            if bound:
                return sum(1 for sb in self._idle.values() if sb.tier.name == tier)
            return len(self._ready[tier])

    def ready_count(self, tier: str) -> int:
        with self._lock:
            return len(self._ready[tier])

    def bindings(self) -> dict[str, Key]:
        """Container id -> (tenant, tier) of every idle bound container."""
        with self._lock:
            return {cid: (sb.tenant or "", sb.tier.name) for cid, sb in self._idle.items()}

    def target(self, tier: str, now: float | None = None) -> int:
        """Unbound containers wanted for `tier` now: the configured size, or more under load."""
        base = self.sizes.get(tier, 0)
        if base == 0:
            return 0
        now = time.monotonic() if now is None else now
        takes = self._takes[tier]
        while takes and takes[0] < now - RATE_WINDOW_S:
            takes.popleft()
        rate = len(takes) / RATE_WINDOW_S
        return min(self.limits.max_size, max(base, math.ceil(rate * self._build_s * 1.5)))

    # -- taking and giving back ----------------------------------------------------
    def acquire(self, tier: Tier, tenant: str, wait_s: float = 30.0) -> DockerSandbox:
        """A ready sandbox for `tenant` on `tier`: its own idle one, else an unbound one it binds; for a
        pooled tier whose builders are busy, the next one they finish (a queue of callers each starting
        a container at once only slows the engine down); else one started now. Never one found dead."""
        dead: list[DockerSandbox] = []
        try:
            return self._acquire(tier, tenant, wait_s, dead)
        finally:
            for sandbox in dead:
                self.backend.destroy(sandbox)  # its socket and pidfd; the removal is the remover's

    def _acquire(self, tier: Tier, tenant: str, wait_s: float, dead: list[DockerSandbox]) -> DockerSandbox:
        key = (tenant, tier.name)
        started = time.monotonic()
        deadline = started + wait_s
        counted = was_coming = False
        with self._lock:
            self._note_busy(key, +1)
            own_until = time.monotonic() + OWN_WAIT_BUILDS * self._build_s if self._others(key) and \
                waits_for_own(self._hold_s, self._held.get(key, 0), self._build_s) else 0.0
            while True:
                if self._closing:
                    self._note_busy(key, -1)
                    raise SandboxUnavailable("the sandbox pool is closed")
                own = self._take_idle(key, dead)
                if own is not None:
                    self.reuses += 1
                    return self._hand_out(own, key)
                cleaning_until = min(deadline, started + CLEANUP_TIMEOUT_S + 1)
                if key in self._cleaning.values() and time.monotonic() < cleaning_until:
                    # the tenant's container is only cleaning up (milliseconds, CLEANUP_TIMEOUT_S at most):
                    # cheaper than another
                    self._arrived.wait(timeout=cleaning_until - time.monotonic())
                    continue
                if own_until:
                    coming = not self._held.get(key) and key in self._seeking
                    if coming or was_coming:
                        # the tenant's first container is on its way to another of its callers (or was, until
                        # now): the wait for it to come free counts from its hand-out
                        own_until = max(own_until, time.monotonic() + OWN_WAIT_BUILDS * self._build_s)
                    was_coming = coming
                if time.monotonic() < min(own_until, deadline) and self._others(key):
                    self._arrived.wait(timeout=min(own_until, deadline) - time.monotonic())
                    continue
                if not counted:
                    self._note_take(tier.name)
                    counted = True
                unbound = self._take_ready(tier.name, dead)
                if unbound is not None:
                    return self._hand_out(self._bind(unbound, tenant), key)
                if tier.name not in self.sizes or self._building[tier.name] == 0 or time.monotonic() >= deadline:
                    _count_in(self._seeking, key, +1)
                    break
                self._waiting[tier.name] += 1
                _count_in(self._seeking, key, +1)
                self._wake.notify()
                try:
                    self._arrived.wait(timeout=deadline - time.monotonic())
                finally:
                    self._waiting[tier.name] -= 1
                    _count_in(self._seeking, key, -1)
        self.cold_starts += 1
        try:
            sandbox = self._bind(self.backend.create_sandbox(tier), tenant)
            with self._lock:
                _count_in(self._seeking, key, -1)
                return self._hand_out(sandbox, key)
        except BaseException:
            with self._lock:
                _count_in(self._seeking, key, -1)
                self._note_busy(key, -1)
            raise

    def cleaning(self, sandbox: DockerSandbox) -> None:
        """The sandbox's call has returned; its cleanup is still to be read, then it is released. Its tenant's
        callers wait for it meanwhile rather than take another."""
        with self._lock:
            self._cleaning[sandbox.container_id] = (sandbox.tenant or "", sandbox.tier.name)

    def release(self, sandbox: DockerSandbox, retired_because: str | None = None) -> None:
        """Give a sandbox back after its execution: kept for its tenant, or retired. `retired_because`:
        the backend already retired it (an anomaly); else the pool decides, and destroys it if it goes."""
        tier, key = sandbox.tier, (sandbox.tenant or "", sandbox.tier.name)
        why = retired_because
        if why is None and sandbox.executions >= self._limit(tier.max_executions, self.limits.max_executions):
            why = "executions"
        if why is None and time.monotonic() - sandbox.created_at >= self._limit(tier.max_age_s,
                                                                                self.limits.max_age_s):
            why = "age"
        evicted: list[DockerSandbox] = []
        with self._lock:
            self._cleaning.pop(sandbox.container_id, None)
            self._note_busy(key, -1)
            _count_in(self._held, key, -1)
            self._hold_s = 0.8 * self._hold_s + 0.2 * (time.monotonic() - sandbox.taken_at)
            if why is None and self._closing:
                why = "closing"
            if why is None and self._idle_of(key) >= self._wanted_idle(key):
                why = "surplus"
            if why is None:
                self._idle[sandbox.container_id] = sandbox
                while len(self._idle) > self.limits.max_bound:
                    evicted.append(self._idle.popitem(last=False)[1])
            self._arrived.notify_all()  # kept, or one fewer held: the tenant's waiting callers look again
            self._count(why)
            self._count("evicted", len(evicted))
        if why is not None and retired_because is None:
            self.backend.destroy(sandbox)  # still up: the backend retired only the unreusable ones
        for old in evicted:
            self.backend.destroy(old)

    def retire_idle(self, now: float | None = None) -> int:
        """Destroy warm sandboxes that waited longer than their tier's max idle age, bound ones past their
        max age, and any found dead (builders replace the unbound ones)."""
        now = time.monotonic() if now is None else now
        stale: list[DockerSandbox] = []
        dead: list[DockerSandbox] = []
        with self._lock:
            for name, ready in self._ready.items():
                limit = self._limit(self.tiers[name].max_idle_s, self.limits.max_idle_s)
                while ready and now - ready[0].created_at > limit:
                    stale.append(ready.popleft())
                for sb in [sb for sb in ready if not self.backend.alive(sb)]:
                    ready.remove(sb)
                    dead.append(sb)
            for cid, sb in list(self._idle.items()):
                idle = now - sb.last_used > self._limit(sb.tier.max_idle_s, self.limits.max_idle_s)
                old = now - sb.created_at > self._limit(sb.tier.max_age_s, self.limits.max_age_s)
                if idle or old:
                    stale.append(self._idle.pop(cid))
                elif not self.backend.alive(sb):
                    dead.append(self._idle.pop(cid))
            self._count("idle", len(stale))
            self._count("gone", len(dead))
            if stale or dead:
                self._wake.notify_all()
        for sandbox in stale + dead:
            self.backend.destroy(sandbox)
        return len(stale) + len(dead)

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
            idle = [sb for q in self._ready.values() for sb in q] + list(self._idle.values())
            for q in self._ready.values():
                q.clear()
            self._idle.clear()
        for sandbox in idle:
            self.backend.destroy(sandbox)

    # -- bookkeeping (under the lock) ----------------------------------------------
    @staticmethod
    def _limit(tier_value: float | None, default: float) -> float:
        return tier_value if tier_value is not None else default

    def _others(self, key: Key) -> bool:
        """Whether other callers of `key` hold or are getting a container (this caller is counted busy)."""
        return self._held.get(key, 0) > 0 or self._busy.get(key, 0) > 1

    def _hand_out(self, sandbox: DockerSandbox, key: Key) -> DockerSandbox:
        _count_in(self._held, key, +1)
        sandbox.taken_at = time.monotonic()
        return sandbox

    @staticmethod
    def _bind(sandbox: DockerSandbox, tenant: str) -> DockerSandbox:
        sandbox.tenant = tenant
        return sandbox

    def _take_idle(self, key: Key, dead: list[DockerSandbox]) -> DockerSandbox | None:
        for cid in list(reversed(self._idle)):  # most recently used first; dead ones are dropped on the way
            sb = self._idle[cid]
            if (sb.tenant, sb.tier.name) == key and self._usable(self._idle.pop(cid), dead):
                return sb
        return None

    def _take_ready(self, tier: str, dead: list[DockerSandbox]) -> DockerSandbox | None:
        ready = self._ready.get(tier)
        while ready:
            sb = ready.popleft()
            if self._usable(sb, dead):
                return sb
        return None

    def _usable(self, sandbox: DockerSandbox, dead: list[DockerSandbox]) -> bool:
        """Whether a container just taken from the pool still serves; a dead one goes to `dead` (the
        builders then make up the deficit)."""
        if self.backend.alive(sandbox):
            return True
        log.warning("warm sandbox container %s was gone before its use (removed or stopped from outside); "
                    "dropped", sandbox.container_id[:12])
        dead.append(sandbox)
        self._count("gone")
        self._wake.notify_all()
        return False

    def _idle_of(self, key: Key) -> int:
        return sum(1 for sb in self._idle.values() if (sb.tenant, sb.tier.name) == key)

    def _note_take(self, tier: str) -> None:
        if tier in self._takes:
            self._takes[tier].append(time.monotonic())
        self._wake.notify()

    def _note_busy(self, key: Key, delta: int) -> None:
        busy = _count_in(self._busy, key, delta)
        samples = self._concurrency.setdefault(key, deque())
        now = time.monotonic()
        samples.append((now, max(busy, 0) + (1 if delta < 0 else 0)))
        while samples and samples[0][0] < now - 3 * RATE_WINDOW_S:
            samples.popleft()
        if not samples:
            del self._concurrency[key]

    def _wanted_idle(self, key: Key) -> int:
        """Idle containers worth keeping for `key`: as many as it recently ran at once, minus those busy."""
        recent = max((n for _, n in self._concurrency.get(key, ())), default=1)
        return max(1, recent - self._busy.get(key, 0))

    def _count(self, reason: str | None, n: int = 1) -> None:
        if reason is not None and n:
            self.retired[reason] = self.retired.get(reason, 0) + n
            RETIRED.labels(reason=reason).inc(n)

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
                    self._arrived.notify_all()
            if closing:
                self.backend.destroy(sandbox)
                return


class PooledDocker:
    """The Docker backend behind a warm pool: an execution takes its tenant's warm container, or binds a
    started one, and gives it back when it may serve the tenant again.

    A call returns with its program's exit record. The supervisor's cleanup after the program (killing
    what the program left, removing its files, checking that nothing of its uid is left: ~1-2 ms) ends
    with the ready record, which a settler thread reads; only then does the container go back to the pool,
    or retire when it is not clean. Until then it counts as held by its tenant."""

    def __init__(self, docker: DockerBackend, pool: WarmPool) -> None:
        self.docker = docker
        self.pool = pool
        self._settler = ThreadPoolExecutor(SETTLERS, thread_name_prefix="sandbox-settle")

    @property
    def name(self) -> str:
        return self.docker.name

    def execute(self, code: str, tier: Tier, tenant: str) -> SandboxResult:
        """Run `code` in a container of the tenant's; a container lost under the call (the host's trouble:
        the program cannot end its supervisor) is replaced and the call runs again from the start, in
        a container of its own (no network: nothing outside saw the lost run). After `RUNS_PER_CALL`
        lost ones, the result is `unavailable` (the sandbox worker sends the call again later)."""
        started = time.monotonic()
        for _ in range(RUNS_PER_CALL - 1):
            result = self._run_once(code, tier, tenant, started)
            if result.error_kind is not ErrorKind.UNAVAILABLE:
                return result
        return self._run_once(code, tier, tenant, started)

    def _run_once(self, code: str, tier: Tier, tenant: str, started: float) -> SandboxResult:
        sandbox = self.pool.acquire(tier, tenant)
        try:
            executed, cleaning = self.docker.run_to_exit(sandbox, code, tenant=tenant, started=started)
        except BaseException:
            self.docker.destroy(sandbox)
            self.pool.release(sandbox, retired_because="error")
            raise
        if cleaning is None:
            self.pool.release(sandbox, executed.retired_because)
        else:
            self.pool.cleaning(sandbox)
            try:
                self._settler.submit(self._settle, sandbox, cleaning)
            except RuntimeError:  # closing: the settlers are gone
                self._settle(sandbox, cleaning)
        if executed.result.error_kind is ErrorKind.UNAVAILABLE:
            log.warning("sandbox container %s was lost during a call on tier %s (%s)", sandbox.container_id[:12],
                        tier.name, executed.retired_because)
        return executed.result

    def _settle(self, sandbox: DockerSandbox, cleaning: Demux) -> None:
        why: str | None = "error"
        try:
            why = self.docker.settle(sandbox, cleaning)
        except BaseException:
            log.exception("sandbox container %s: reading its cleanup failed; retired", sandbox.container_id[:12])
            self.docker.destroy(sandbox)
        finally:
            self.pool.release(sandbox, why)  # whatever happened: its tenant's callers wait for it

    def ping(self) -> None:
        self.docker.ping()

    def sweep(self, policy: SweepPolicy) -> list[tuple[str, ReapReason]]:
        self.pool.retire_idle()
        return self.docker.sweep(policy)

    def close(self) -> None:
        self._settler.shutdown(wait=True)  # the containers still cleaning up go back (and then) with the rest
        self.pool.close()
        self.docker.close()
