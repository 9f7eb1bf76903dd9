"""The sandbox service: tier lookup, quota gate, backend (+ warm pool), metrics.

`SandboxService` is what a sandbox worker process holds (one per process, started
lazily or at worker_process_init, closed at shutdown). `run_code` is the one-shot
form for scripts and the CLI. Both turn infrastructure failures into a result with
`error="sandbox_unavailable: ..."`, so a run goes on or fails visibly, never silently.
"""

from __future__ import annotations

import logging
import time

from .config import SandboxSettings
from .docker_backend import DockerBackend
from .errors import SandboxUnavailable
from .metrics import DURATION, EXECUTIONS, QUOTA_REJECTIONS, init_labels
from .models import SandboxResult, Tier
from .pool import WarmPool
from .process_backend import ProcessBackend
from .quotas import QuotaGate, Rejection
from .tiers import get_tier, load_tiers

log = logging.getLogger(__name__)

Backend = DockerBackend | ProcessBackend


def make_backend(choice: str, settings: SandboxSettings) -> Backend:
    """Start the chosen backend; `auto` = Docker when an engine answers, else process."""
    if choice not in ("docker", "process", "auto"):
        raise ValueError(f"unknown sandbox backend {choice!r}; use docker, process or auto")
    if choice in ("docker", "auto"):
        docker_backend = DockerBackend(settings.sandbox_image)
        try:
            docker_backend.start()
            return docker_backend
        except SandboxUnavailable as exc:
            docker_backend.close()
            if choice == "docker":
                raise
            log.warning("Docker backend unavailable (%s); using the process backend (weaker isolation)", exc)
    backend = ProcessBackend(settings.sandbox_process_python, confinement=settings.sandbox_process_confinement)
    backend.start()
    return backend


class SandboxService:
    """Executes code for tenants under their tier's limits and quotas."""

    def __init__(self, settings: SandboxSettings | None = None, *, backend: str | None = None,
                 redis_url: str | None = None, pool: bool = True) -> None:
        self.settings = settings or SandboxSettings()
        self.backend_choice = backend or self.settings.sandbox_backend
        self.redis_url = redis_url
        self.use_pool = pool
        self.tiers: dict[str, Tier] = {}
        self.backend: Backend | None = None
        self.pool: WarmPool | None = None
        self.quotas: QuotaGate | None = None
        self.start_error: str | None = None

    def start(self) -> None:
        """Load tiers, connect the quota store, start the backend and (for Docker) the pool.

        A backend that cannot start is remembered, not raised: every execution then
        returns a `sandbox_unavailable` result naming the cause.
        """
        self.tiers = load_tiers(self.settings.sandbox_tiers_file)
        init_labels(self.tiers)
        if self.redis_url:
            self.quotas = QuotaGate(self.redis_url)
            self.quotas.start()
        try:
            self.backend = make_backend(self.backend_choice, self.settings)
        except SandboxUnavailable as exc:
            self.start_error = str(exc)
            return
        if self.use_pool and isinstance(self.backend, DockerBackend):
            self.pool = WarmPool(self.backend, self.tiers, self.pool_sizes())
            self.pool.start()

    def pool_sizes(self) -> dict[str, int]:
        wanted = {t.strip() for t in self.settings.sandbox_pool_tiers.split(",") if t.strip()}
        return {
            name: (tier.pool_size if tier.pool_size is not None else self.settings.sandbox_pool_size)
            for name, tier in self.tiers.items() if not wanted or name in wanted
        }

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.backend is not None:
            self.backend.close()
            self.backend = None
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
                return self._record(self._failure(spec, started, verdict.message()))
            slot = verdict
        result = None
        try:
            result = self._run(code, spec, started)
        finally:
            if slot is not None and self.quotas is not None:
                cpu = result.cpu_seconds if result is not None else None
                if cpu is None:
                    cpu = (time.monotonic() - started) * spec.cpus
                self.quotas.release(slot, cpu)
        return self._record(result)

    def _run(self, code: str, spec: Tier, started: float) -> SandboxResult:
        if self.backend is None:
            return self._failure(spec, started, f"sandbox_unavailable: {self.start_error or 'not started'}")
        try:
            if self.pool is not None and isinstance(self.backend, DockerBackend):
                sandbox = self.pool.acquire(spec)
                return self.backend.run(sandbox, code, started=started)
            return self.backend.execute(code, spec)
        except SandboxUnavailable as exc:
            return self._failure(spec, started, f"sandbox_unavailable: {exc}")

    def _failure(self, spec: Tier, started: float, error: str) -> SandboxResult:
        return SandboxResult(exit_code=None, stdout="", stderr="", tier=spec.name, error=error,
                             duration_ms=int((time.monotonic() - started) * 1000),
                             backend=self.backend_name)

    @staticmethod
    def _record(result: SandboxResult) -> SandboxResult:
        EXECUTIONS.labels(tier=result.tier, outcome=result.outcome).inc()
        DURATION.labels(tier=result.tier).observe(result.duration_ms / 1000)
        return result


def run_code(code: str, *, tier: str = "standard", tenant: str = "default", backend: str | None = None,
             redis_url: str | None = None) -> SandboxResult:
    """One-shot execution in a fresh sandbox (quota-checked when `redis_url` is given).

    Over quota or with no usable backend it returns a result with `error` set; an
    unknown tier raises UnknownTierError naming the known tiers.
    """
    service = SandboxService(backend=backend, redis_url=redis_url, pool=False)
    service.tiers = load_tiers(service.settings.sandbox_tiers_file)
    get_tier(tier, service.tiers)  # fail fast, before touching Docker or Redis
    with service:
        return service.execute(code, tier=tier, tenant=tenant)
