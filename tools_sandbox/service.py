"""The sandbox service: tier lookup, quota gate, backend (+ warm pool), sweeper, metrics.

`SandboxService` is what a sandbox worker process holds (one per process, started
lazily or at worker_process_init, closed at shutdown). `run_code` is the one-shot
form for scripts and the CLI. Both turn infrastructure failures into a result with
`error_kind="unavailable"`, so a run goes on or fails visibly, never silently.

Fail closed: the backend is the one configured (`docker` by default). Only `auto` may fall
back to the weaker process backend, and then every result names it (`backend="process"`).
The tenant's CPU quota and `reactq_sandbox_cpu_seconds_total` are charged with the CPU time
the host measured; where it measured nothing, with wall time x the tier's CPUs.
"""

from __future__ import annotations

import logging
import time

from .backend import PooledDocker, SandboxBackend
from .config import SandboxSettings
from .docker_backend import DockerBackend
from .errors import SandboxUnavailable
from .metrics import CPU_SECONDS, DURATION, EXECUTIONS, QUOTA_REJECTIONS, REAPED, init_labels, tenant_label
from .models import ErrorKind, SandboxResult, Tier
from .pool import WarmPool
from .process_backend import ProcessBackend
from .quotas import QuotaGate, Rejection
from .sweeper import ReapReason, Sweeper, SweepPolicy
from .tiers import get_tier, load_tiers

log = logging.getLogger(__name__)

BACKENDS = ("docker", "process", "auto")


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
            pool = WarmPool(docker_backend, tiers, pool_sizes, builders=settings.sandbox_pool_builders,
                            max_size=settings.sandbox_pool_max, max_idle_s=settings.sandbox_max_idle_s)
            pool.start()
            return PooledDocker(docker_backend, pool), pool
    backend = ProcessBackend(settings.sandbox_process_python, confinement=settings.sandbox_process_confinement)
    backend.start()
    return backend, None


class SandboxService:
    """Executes code for tenants under their tier's limits and quotas."""

    def __init__(self, settings: SandboxSettings | None = None, *, backend: str | None = None,
                 redis_url: str | None = None, pool: bool = True) -> None:
        self.settings = settings or SandboxSettings()
        self.backend_choice = backend or self.settings.sandbox_backend
        self.redis_url = redis_url
        self.use_pool = pool
        self.tiers: dict[str, Tier] = {}
        self.backend: SandboxBackend | None = None
        self.pool: WarmPool | None = None
        self.quotas: QuotaGate | None = None
        self.sweeper: Sweeper | None = None
        self.start_error: str | None = None

    def start(self) -> None:
        """Load tiers, connect the quota store, start the backend, its pool (Docker) and the sweeper.

        A backend that cannot start is remembered, not raised: every execution then
        returns an `unavailable` result naming the cause.
        """
        self.tiers = load_tiers(self.settings.sandbox_tiers_file)
        init_labels(self.tiers, self.settings.tenants)
        if self.redis_url:
            self.quotas = QuotaGate(self.redis_url)
            self.quotas.start()
        try:
            self.backend, self.pool = make_backend(self.backend_choice, self.settings, self.tiers,
                                                   self.pool_sizes() if self.use_pool else None)
        except SandboxUnavailable as exc:
            self.start_error = str(exc)
            return
        for _ in self.pool.reaped if self.pool is not None else []:
            REAPED.labels(reason=ReapReason.ORPHAN.value).inc()
        policy = self.sweep_policy()
        backend = self.backend
        self.sweeper = Sweeper(lambda: backend.sweep(policy), self.settings.sandbox_sweep_interval_s,
                               on_reaped=lambda reason: REAPED.labels(reason=reason.value).inc())
        self.sweeper.start()

    def sweep_policy(self) -> SweepPolicy:
        return SweepPolicy(self.tiers, grace_s=self.settings.sandbox_sweep_grace_s,
                           default_max_idle_s=self.settings.sandbox_max_idle_s)

    def pool_sizes(self) -> dict[str, int]:
        wanted = {t.strip() for t in self.settings.sandbox_pool_tiers.split(",") if t.strip()}
        return {
            name: (tier.pool_size if tier.pool_size is not None else self.settings.sandbox_pool_size)
            for name, tier in self.tiers.items() if not wanted or name in wanted
        }

    def close(self) -> None:
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

    def __enter__(self) -> SandboxService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def backend_name(self) -> str:
        return self.backend.name if self.backend is not None else self.backend_choice

    def execute(self, code: str, *, tier: str = "standard", tenant: str = "default") -> SandboxResult:
        """Run `code` for `tenant` on `tier`; UnknownTierError for a tier not in the tiers file."""
        spec = get_tier(tier, self.tiers)
        started = time.monotonic()
        slot = None
        if self.quotas is not None:
            verdict = self.quotas.acquire(spec, tenant)
            if isinstance(verdict, Rejection):
                QUOTA_REJECTIONS.labels(tier=spec.name, quota=verdict.quota).inc()
                refused = SandboxResult.refused(tier=spec.name, backend=self.backend_name, quota=verdict.quota,
                                                message=verdict.message(),
                                                duration_ms=int((time.monotonic() - started) * 1000))
                return self._record(refused, tenant)
            slot = verdict
        result = None
        try:
            result = self._run(code, spec, started)
        finally:
            cpu = result.cpu_seconds if result is not None else None
            if result is not None and result.error_kind is ErrorKind.UNAVAILABLE:
                cpu = 0.0  # our failure: the tenant is not charged
            elif cpu is None:
                cpu = (time.monotonic() - started) * spec.cpus
                if result is not None:
                    result = result.model_copy(update={"cpu_seconds": cpu})
            if slot is not None and self.quotas is not None:
                self.quotas.release(slot, cpu)
        return self._record(result, tenant)

    def _run(self, code: str, spec: Tier, started: float) -> SandboxResult:
        if self.backend is None:
            log.warning("sandbox backend not started: %s", self.start_error)
            return self._failure(spec, started, f"sandbox_unavailable: {self.start_error or 'not started'}",
                                 ErrorKind.UNAVAILABLE)
        try:
            return self.backend.execute(code, spec)
        except SandboxUnavailable as exc:
            return self._failure(spec, started, f"sandbox_unavailable: {exc}", ErrorKind.UNAVAILABLE)

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

