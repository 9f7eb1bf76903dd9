"""Data shapes: the result of one execution, a tier, and a tenant's quotas.

SandboxResult is the contract's result object (DESIGN.md) plus `backend`, so every
observation says which isolation produced it: "docker", or the weaker "process"
(bubblewrap) or "process-unshare" (util-linux unshare, for hosts without bwrap).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class SandboxResult(BaseModel):
    """What one execution produced; a failure of the code is data here, never an exception."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_ms: int = 0
    tier: str
    error: str | None = None
    backend: str
    # CPU seconds the program used, when the agent reported them (quota accounting only).
    _cpu_seconds: float | None = PrivateAttr(default=None)

    @property
    def cpu_seconds(self) -> float | None:
        return self._cpu_seconds

    def with_cpu(self, seconds: float | None) -> SandboxResult:
        self._cpu_seconds = seconds
        return self

    @property
    def outcome(self) -> str:
        """A small closed set, used as the metrics label."""
        if self.error is not None:
            if self.error.startswith("quota_exceeded"):
                return "quota_exceeded"
            if self.error.startswith("sandbox_unavailable"):
                return "unavailable"
        if self.timed_out:
            return "timeout"
        if self.oom_killed:
            return "oom"
        if self.truncated:
            return "truncated"
        if self.exit_code == 0 and self.error is None:
            return "ok"
        return "error"

    def observation(self) -> str:
        """The text an agent sees: output, then markers for every limit that was hit."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr.rstrip(chr(10))}")
        if self.truncated:
            parts.append("[output truncated: the tier's output limit was reached]")
        if self.timed_out:
            parts.append("[killed: time limit reached]")
        if self.oom_killed:
            parts.append("[killed: memory limit reached]")
        if self.error:
            parts.append(f"[error: {self.error}]")
        elif self.exit_code not in (0, None):
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts) if parts else "[no output]"


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
    # An OCI runtime such as "runsc" (gVisor); used only where the engine has it.
    runtime: str | None = None
    # Warm containers for this tier; None = the service default.
    pool_size: int | None = Field(default=None, ge=0)
    quota: TenantQuota
