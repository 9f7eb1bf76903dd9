"""The seam between the sandbox service and the ways of isolating code.

`SandboxBackend` is what SandboxService holds: the Docker backend one-shot, the Docker
backend behind its warm pool (`PooledDocker`), or the weaker process backend. The service
never asks which one it has.
"""

from __future__ import annotations

import time
from typing import Protocol

from .docker_backend import DockerBackend
from .models import SandboxResult, Tier
from .pool import WarmPool
from .sweeper import ReapReason, SweepPolicy


class SandboxBackend(Protocol):
    """A started backend: runs one execution per call, and cleans up after itself."""

    @property
    def name(self) -> str:
        """Which isolation produced a result ("docker", "process", "process-unshare")."""
        ...

    def execute(self, code: str, tier: Tier, tenant: str) -> SandboxResult:
        """Run `code` for `tenant` under `tier`'s limits; SandboxUnavailable when the infrastructure cannot."""
        ...

    def sweep(self, policy: SweepPolicy) -> list[tuple[str, ReapReason]]:
        """Kill and remove sandboxes that outlived their limits; what was removed, and why."""
        ...

    def ping(self) -> None:
        """Return if the backend can run code again after a failure; SandboxUnavailable if not."""
        ...

    def close(self) -> None:
        ...


class PooledDocker:
    """The Docker backend behind a warm pool: an execution takes its tenant's warm container, or binds a
    started one, and gives it back when it may serve the tenant again."""

    def __init__(self, docker: DockerBackend, pool: WarmPool) -> None:
        self.docker = docker
        self.pool = pool

    @property
    def name(self) -> str:
        return self.docker.name

    def execute(self, code: str, tier: Tier, tenant: str) -> SandboxResult:
        started = time.monotonic()
        sandbox = self.pool.acquire(tier, tenant)
        try:
            executed = self.docker.run(sandbox, code, tenant=tenant, started=started)
        except BaseException:
            self.docker.destroy(sandbox)
            self.pool.release(sandbox, retired_because="error")
            raise
        self.pool.release(sandbox, executed.retired_because)
        return executed.result

    def ping(self) -> None:
        self.docker.ping()

    def sweep(self, policy: SweepPolicy) -> list[tuple[str, ReapReason]]:
        self.pool.retire_idle()
        return self.docker.sweep(policy)

    def close(self) -> None:
        self.pool.close()
        self.docker.close()
