"""The seam between the sandbox service and the ways of isolating code.

`SandboxBackend` is what SandboxService holds: the Docker backend one-shot, the Docker
backend behind its warm pool (`backends.pool.PooledDocker`), or the weaker process backend.
The service never asks which one it has. This module names no concrete backend: the edge
(edges/service.py) constructs them.
"""

from __future__ import annotations

from typing import Protocol

from .models import ReapReason, SandboxResult, Tier
from .sweeper import SweepPolicy


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

