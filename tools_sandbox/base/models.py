"""Data shapes: the result of one execution, its error kind, a tier, and a tenant's quotas.

SandboxResult is the contract's result object (docs/DESIGN.md) plus `backend`, so every
observation says which isolation produced it: "docker", or the weaker "process"
(bubblewrap) or "process-unshare" (util-linux unshare, for hosts without bwrap).
Every figure in it was measured by the host (the sandboxed program can forge
anything it sends, so nothing it sends is believed beyond its own output bytes).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class ErrorKind(StrEnum):
    """Why an execution did not simply run to completion: a small closed set (also a metrics label).

    Only `unavailable` is the infrastructure's fault; the others are the program's doing, the tenant's
    limits, or (`protocol_violation`) a program that tampered with the sandbox's own reporting.
    """

    TIMEOUT = "timeout"
    OOM = "oom"
    OUTPUT_LIMIT = "output_limit"
    PROTOCOL_VIOLATION = "protocol_violation"
    QUOTA_EXCEEDED = "quota_exceeded"
    UNKNOWN_TIER = "unknown_tier"
    UNAVAILABLE = "unavailable"


class ReapReason(StrEnum):
    """Why the sweeper removed a container (the `reason` label of reactq_sandbox_reaped_total)."""

    ORPHAN = "orphan"
    OVERRAN = "overran"
    EXPIRED = "expired"
    LEFTOVER = "leftover"


class SandboxResult(BaseModel):
    """What one execution produced; a failure of the code is data here, never an exception.

    Validated wherever it crosses a process boundary (the step worker reads it back from Redis).
    """

    model_config = ConfigDict(extra="forbid")

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_ms: int = Field(default=0, ge=0)
    tier: str
    error: str | None = None
    error_kind: ErrorKind | None = None
    backend: str
    # Measured by the host (the container's cgroup, or the wait4 of the sandbox's process tree);
    # None when nothing was measured (the call never ran). The quota is charged with this figure.
    cpu_seconds: float | None = Field(default=None, ge=0)
    memory_peak_bytes: int | None = Field(default=None, ge=0)
    # Which quota refused the call (in-process only; the stored object says it in `error`).
    _quota: str | None = PrivateAttr(default=None)

    @property
    def quota(self) -> str | None:
        return self._quota

    @classmethod
    def refused(cls, *, tier: str, backend: str, quota: str, message: str, duration_ms: int) -> SandboxResult:
        """The result of a call a tenant quota refused."""
        result = cls(exit_code=None, stdout="", stderr="", tier=tier, backend=backend, error=message,
                     error_kind=ErrorKind.QUOTA_EXCEEDED, duration_ms=duration_ms)
        result._quota = quota
        return result

    @property
    def outcome(self) -> str:
        """The metrics label: the error kind, else `ok` or `error` (a non-zero exit)."""
        if self.error_kind is not None:
            return self.error_kind.value
        return "ok" if self.exit_code == 0 else "error"


class TenantQuota(BaseModel):
    """Per-tenant limits on one tier, enforced across all sandbox workers via Redis."""

    model_config = ConfigDict(extra="forbid")

    concurrent_executions: int = Field(ge=1)
    executions_per_minute: int = Field(ge=1)
    cpu_seconds_per_day: float = Field(gt=0)


class Tier(BaseModel):
    """Resource limits of one execution; a request never gets more than its tier."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    cpus: float = Field(gt=0, le=64)
    memory_mb: int = Field(ge=32)
    wall_time_s: float = Field(gt=0)
    cpu_time_s: int = Field(ge=1)
    pids: int = Field(ge=8)
    output_bytes: int = Field(ge=1024)
    tmpfs_mb: int = Field(ge=1)
    nofile: int = Field(default=256, ge=16)
    # An OCI runtime such as "runsc" (gVisor). An engine without it makes the tier unavailable:
    # the tier never silently runs on the default runtime.
    runtime: str | None = None
    # A runtime this tier gets where the engine has it, and the engine's default where it has not.
    prefer_runtime: str | None = None
    # Warm containers for this tier; None = the service default.
    pool_size: int | None = Field(default=None, ge=0)
    # How long a warm container may wait unused before the pool replaces it; None = the service default.
    max_idle_s: float | None = Field(default=None, gt=0)
    # A container serving one tenant is retired after this many executions or this age (seconds since
    # it started); None = the service defaults.
    max_executions: int | None = Field(default=None, ge=1)
    max_age_s: float | None = Field(default=None, gt=0)
    # A python session (base/session.py): the most earlier cells one execution replays, and how long it
    # may spend replaying them (None: half the wall time).
    session_max_cells: int = Field(default=50, ge=0)
    session_replay_s: float | None = Field(default=None, gt=0)
    quota: TenantQuota
