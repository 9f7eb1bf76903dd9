"""The sandbox service: tier lookup, quota gate, backend (+ warm pool), sweeper, metrics.

`SandboxService` is what a sandbox worker process holds (one per process, started
lazily or at worker_process_init, closed at shutdown). `run_code` is the one-shot
form for scripts and the CLI. Both turn infrastructure failures into a result with
`error_kind="unavailable"`, so a run goes on or fails visibly, never silently.

Fail closed: the backend is the one configured (`docker` by default). Only `auto` may fall
back to the weaker process backend, and then every result names it (`backend="process"`).
The tenant's CPU quota and `reactq_sandbox_cpu_seconds_total` are charged with the CPU time
the host measured; where it measured nothing, with wall time x the tier's CPUs.

Quotas (tools_sandbox/base/quotas.py): a call over its tenant's concurrency or per-minute quota waits
in line, first come first served; only the CPU-day quota refuses. `execute` waits in its own
thread (the CLI, scripts); the Celery task asks `admit` once per delivery and re-queues itself
while the answer is a `Wait`, then runs the call with `run_admitted` (or stores `gave_up`'s
result when its run's deadline passed in line).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ..backends.docker_backend import DockerBackend
from ..backends.pool import Limits, PooledDocker, WarmPool
from ..backends.process_backend import ProcessBackend
from ..base.backend import SandboxBackend
from ..base.config import SandboxSettings
from ..base.errors import SandboxUnavailable, TierUnavailable
from ..base.metrics import CPU_SECONDS, DURATION, EXECUTIONS, QUOTA_REJECTIONS, REAPED, init_labels, tenant_label
from ..base.models import ErrorKind, ReapReason, SandboxResult, Tier
from ..base.quotas import IN_PROGRESS, QuotaGate, Rejection, Slot, Wait
from ..base.sweeper import Sweeper, SweepPolicy
from ..base.tiers import get_tier, load_tiers
from . import health

log = logging.getLogger(__name__)

BACKENDS = ("docker", "process", "auto")
# A backend that cannot run code is tried again after this long, doubling up to PROBE_MAX_S.
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 30.0


def make_backend(choice: str, settings: SandboxSettings, tiers: dict[str, Tier] | None = None,
                 pool_sizes: dict[str, int] | None = None) -> tuple[SandboxBackend, WarmPool | None]:
    """Start the chosen backend; `auto` = Docker when an engine answers, else process.

    With `pool_sizes`, a Docker backend comes behind a started warm pool (also returned).
    """
    if choice not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {choice!r}; use docker, process or auto")
    if choice in ("docker", "auto"):
        docker_backend = DockerBackend(settings.sandbox_image)
        try:
            docker_backend.start()
        except SandboxUnavailable as exc:
            docker_backend.close()
            if choice == "docker":
                raise
            log.warning("Docker backend unavailable (%s); auto uses the process backend (weaker isolation)", exc)
        else:
            if pool_sizes is None or tiers is None:
                return docker_backend, None
            limits = Limits(max_size=settings.sandbox_pool_max, max_idle_s=settings.sandbox_max_idle_s,
                            max_age_s=settings.sandbox_max_age_s, max_executions=settings.sandbox_max_executions,
                            max_bound=settings.sandbox_pool_bound_max)
            pool = WarmPool(docker_backend, tiers, pool_sizes, builders=settings.sandbox_pool_builders,
                            limits=limits)
            pool.start()
            return PooledDocker(docker_backend, pool), pool
    backend = ProcessBackend(settings.sandbox_process_python, confinement=settings.sandbox_process_confinement)
    backend.start()
    return backend, None


@dataclass(frozen=True)
class Admitted:
    """A call the quota gate let through: its tier, and the slot to free (None without a quota store)."""

    tier: Tier
    slot: Slot | None


class SandboxService:
    """Executes code for tenants under their tier's limits and quotas."""

    def __init__(self, settings: SandboxSettings | None = None, *, backend: str | None = None,
                 redis_url: str | None = None, pool: bool = True, quotas: QuotaGate | None = None) -> None:
        """Quotas are checked on `redis_url`'s Redis, or by the gate given (a sandbox worker's, on its client)."""
        self.settings = settings or SandboxSettings()
        self.backend_choice = backend or self.settings.sandbox_backend
        self.redis_url = redis_url
        self._gate = quotas
        self.use_pool = pool
        self.tiers: dict[str, Tier] = {}
        self.backend: SandboxBackend | None = None
        self.pool: WarmPool | None = None
        self.quotas: QuotaGate | None = None
        self.sweeper: Sweeper | None = None
        self.start_error: str | None = None
        self.up = False  # the backend can run code now (health.report tells the worker)
        self._closed = threading.Event()
        self._probe: threading.Thread | None = None
        self._probe_lock = threading.Lock()

    def start(self) -> None:
        """Load tiers, connect the quota store, start the backend, its pool (Docker) and the sweeper.

        A backend that cannot start is remembered, not raised: it is reported down (the worker takes no
        sandbox task meanwhile), a probe thread tries again with backoff, and an execution until then
        returns an `unavailable` result naming the cause.
        """
        self._closed.clear()
        self.tiers = load_tiers(self.settings.sandbox_tiers_file)
        init_labels(self.tiers, self.settings.tenants)
        if self._gate is not None or self.redis_url:
            self.quotas = self._gate or QuotaGate(self.redis_url or "",
                                                  waiter_stale_s=self.settings.sandbox_waiter_stale_s)
            self.quotas.start()
        if not self._start_backend():
            self._probe_later()

    def _start_backend(self) -> bool:
        try:
            backend, pool = make_backend(self.backend_choice, self.settings, self.tiers,
                                         self.pool_sizes() if self.use_pool else None)
        except SandboxUnavailable as exc:
            self.start_error = str(exc)
            self._report(False, self.start_error)
            return False
        if self._closed.is_set():  # closed while a probe started it: nothing may outlive close()
            backend.close()
            return False
        self.backend, self.pool = backend, pool
        for _ in self.pool.reaped if self.pool is not None else []:
            REAPED.labels(reason=ReapReason.ORPHAN.value).inc()
        policy = self.sweep_policy()
        backend = self.backend
        self.sweeper = Sweeper(lambda: backend.sweep(policy), self.settings.sandbox_sweep_interval_s,
                               on_reaped=lambda reason: REAPED.labels(reason=reason.value).inc())
        self.sweeper.start()
        self.start_error = None
        self._report(True)
        return True

    def _report(self, up: bool, why: str = "") -> None:
        self.up = up
        health.report(self.backend_choice, up, why)

    def mark_down(self, why: str) -> None:
        """An execution found the backend unable to run code: report it down until a probe succeeds."""
        if self.up:
            self._report(False, why)
        self._probe_later()

    def _probe_later(self) -> None:
        """Try the backend again (start it, or ping a started one) with backoff until it can run code."""
        with self._probe_lock:
            if self._closed.is_set() or (self._probe is not None and self._probe.is_alive()):
                return
            self._probe = threading.Thread(target=self._probe_loop, name="sandbox-backend-probe", daemon=True)
            self._probe.start()

    def _probe_loop(self) -> None:
        delay = PROBE_FIRST_S
        while not self._closed.wait(delay):
            if self.backend is None:
                if self._start_backend():
                    return
            else:
                try:
                    self.backend.ping()
                except SandboxUnavailable as exc:
                    log.debug("sandbox backend probe failed: %s", exc)
                else:
                    self._report(True)
                    return
            delay = min(delay * 2, PROBE_MAX_S)

    def sweep_policy(self) -> SweepPolicy:
        return SweepPolicy(self.tiers, grace_s=self.settings.sandbox_sweep_grace_s,
                           default_max_idle_s=self.settings.sandbox_max_idle_s,
                           default_max_age_s=self.settings.sandbox_max_age_s)

    def pool_sizes(self) -> dict[str, int]:
        wanted = {t.strip() for t in self.settings.sandbox_pool_tiers.split(",") if t.strip()}
        return {
            name: (tier.pool_size if tier.pool_size is not None else self.settings.sandbox_pool_size)
            for name, tier in self.tiers.items() if not wanted or name in wanted
        }

    def close(self) -> None:
        self._closed.set()
        if self.sweeper is not None:
            self.sweeper.close()
            self.sweeper = None
        if self.backend is not None:
            self.backend.close()
            self.backend = None
            self.pool = None
        if self.quotas is not None:
            self.quotas.close()
            self.quotas = None
        self.up = False
        health.reset()

    def __enter__(self) -> SandboxService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def backend_name(self) -> str:
        return self.backend.name if self.backend is not None else self.backend_choice

    def execute(self, code: str, *, tier: str = "standard", tenant: str = "default",
                wait_s: float | None = None) -> SandboxResult:
        """Run `code` for `tenant` on `tier`, waiting in line in this thread (up to `wait_s`, default
        REACTQ_SANDBOX_WAIT_MAX_S) while the tenant is at its concurrency or per-minute quota: the CLI's
        and scripts' form. The Celery task waits by re-queueing itself instead (`admit`, `run_admitted`).
        UnknownTierError for a tier not in the tiers file."""
        ticket, arrival = uuid.uuid4().hex, time.time()
        deadline = arrival + (self.settings.sandbox_wait_max_s if wait_s is None else wait_s)
        while True:
            verdict = self.admit(tier, tenant, ticket=ticket, arrival=arrival)
            if not isinstance(verdict, Wait):
                break
            if time.time() >= deadline:
                return self.gave_up(verdict, ticket)
            time.sleep(min(max(verdict.retry_in_s, self.settings.sandbox_wait_poll_s), 1.0,
                           max(0.0, deadline - time.time())))
        if isinstance(verdict, SandboxResult):
            return verdict
        return self.run_admitted(code, verdict, tenant)

    def admit(self, tier: str, tenant: str, *, ticket: str, arrival: float,
              now: float | None = None) -> Admitted | Wait | SandboxResult:
        """Ask the quota gate for a slot for the call `ticket` (arrived at `arrival`): `Admitted` (run it
        with `run_admitted`), `Wait` (poll again with the same ticket and arrival, or `gave_up`), or the
        result of a call the CPU-day quota refuses. UnknownTierError for a tier not in the tiers file."""
        spec = get_tier(tier, self.tiers)
        if self.quotas is None:
            return Admitted(spec, None)
        verdict = self.quotas.acquire(spec, tenant, ticket=ticket, arrival=arrival, now=now)
        if isinstance(verdict, Wait):
            return verdict
        if isinstance(verdict, Rejection):
            QUOTA_REJECTIONS.labels(tier=spec.name, quota=verdict.quota).inc()
            refused = SandboxResult.refused(tier=spec.name, backend=self.backend_name, quota=verdict.quota,
                                            message=verdict.message(), duration_ms=0)
            return self._record(refused, tenant)
        return Admitted(spec, verdict)

    def gave_up(self, wait: Wait, ticket: str) -> SandboxResult:
        """The result of a call whose deadline passed while it waited in line (it leaves the line)."""
        self.leave_line(wait.tier, wait.tenant, ticket)
        quota = "concurrent_executions" if wait.quota == IN_PROGRESS else wait.quota
        QUOTA_REJECTIONS.labels(tier=wait.tier, quota=quota).inc()
        refused = SandboxResult.refused(tier=wait.tier, backend=self.backend_name, quota=quota,
                                        message=wait.gave_up(), duration_ms=0)
        return self._record(refused, wait.tenant)

    def release_unused(self, admitted: Admitted) -> None:
        """Hand back a slot that was not used (nothing ran: the tenant is not charged)."""
        if admitted.slot is not None and self.quotas is not None:
            self.quotas.release(admitted.slot, 0.0)

    def leave_line(self, tier: str, tenant: str, ticket: str) -> None:
        if self.quotas is not None:
            self.quotas.leave(tier, tenant, ticket)

    def run_admitted(self, code: str, admitted: Admitted, tenant: str,
                     keep: Callable[[SandboxResult], None] | None = None) -> SandboxResult:
        """Execute an admitted call, then free its slot and charge the CPU it used; `keep` is handed the
        result before the slot is freed (the task stores it there, so a duplicate of the call that gets
        the slot next finds the result)."""
        spec, slot = admitted.tier, admitted.slot
        started = time.monotonic()
        result = None
        try:
            result = self._run(code, spec, started, tenant)
        finally:
            cpu = result.cpu_seconds if result is not None else None
            if result is not None and result.error_kind is ErrorKind.UNAVAILABLE:
                cpu = 0.0  # our failure: the tenant is not charged
            elif cpu is None:
                cpu = (time.monotonic() - started) * spec.cpus
                if result is not None:
                    result = result.model_copy(update={"cpu_seconds": cpu})
            try:
                if keep is not None and result is not None:
                    keep(result)
            finally:
                if slot is not None and self.quotas is not None:
                    self.quotas.release(slot, cpu)
        return self._record(result, tenant)

    def _run(self, code: str, spec: Tier, started: float, tenant: str) -> SandboxResult:
        if self.backend is None:
            log.warning("sandbox backend not started: %s", self.start_error)
            return self._failure(spec, started, f"sandbox_unavailable: {self.start_error or 'not started'}",
                                 ErrorKind.UNAVAILABLE)
        try:
            result = self.backend.execute(code, spec, tenant)
        except TierUnavailable as exc:  # this tier only: the backend serves the others
            log.warning("sandbox tier refused: %s", exc)
            return self._failure(spec, started, f"sandbox_unavailable: {exc}", ErrorKind.UNAVAILABLE)
        except SandboxUnavailable as exc:
            log.warning("sandbox backend failed during a call: %s", exc)
            self.mark_down(str(exc))
            return self._failure(spec, started, f"sandbox_unavailable: {exc}", ErrorKind.UNAVAILABLE)
        if result.error_kind is ErrorKind.UNAVAILABLE:
            self.mark_down(result.error or "the infrastructure failed during a call")
        return result

    def _failure(self, spec: Tier, started: float, error: str, kind: ErrorKind) -> SandboxResult:
        return SandboxResult(exit_code=None, stdout="", stderr="", tier=spec.name, error=error, error_kind=kind,
                             duration_ms=int((time.monotonic() - started) * 1000),
                             backend=self.backend_name)

    def _record(self, result: SandboxResult, tenant: str) -> SandboxResult:
        EXECUTIONS.labels(tier=result.tier, outcome=result.outcome).inc()
        DURATION.labels(tier=result.tier).observe(result.duration_ms / 1000)
        if result.cpu_seconds:
            CPU_SECONDS.labels(tier=result.tier, tenant=tenant_label(tenant, self.settings.tenants)).inc(
                result.cpu_seconds)
        return result


def run_code(code: str, *, tier: str = "standard", tenant: str = "default", backend: str | None = None,
             redis_url: str | None = None) -> SandboxResult:
    """One-shot execution in a fresh sandbox (quota-checked when `redis_url` is given).

    Over quota or with no usable backend it returns a result with `error_kind` set; an
    unknown tier raises UnknownTierError naming the known tiers.
    """
    service = SandboxService(backend=backend, redis_url=redis_url, pool=False)
    service.tiers = load_tiers(service.settings.sandbox_tiers_file)
    get_tier(tier, service.tiers)  # fail fast, before touching Docker or Redis
    with service:
        return service.execute(code, tier=tier, tenant=tenant)

