"""Settings of the sandbox service, from the environment (prefix REACTQ_).

The production default backend is `docker`: with no engine, executions fail closed as
`unavailable`. The weaker process backend runs only when asked for (`process`, or `auto` =
Docker when an engine answers, else process — what `reactq demo` sets). The tiers come
from tools_sandbox/tiers.toml (deploy/sandbox/tiers.toml links to it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_TIERS_FILE = Path(__file__).resolve().parent.parent / "tiers.toml"  # deploy/sandbox/tiers.toml links here


class SandboxSettings(BaseSettings):
    """Environment-driven configuration; construct with overrides in tests."""

    model_config = SettingsConfigDict(env_prefix="REACTQ_", extra="ignore")

    sandbox_backend: Literal["docker", "process", "auto"] = "docker"
    sandbox_image: str = "reactq-sandbox:latest"
    redis_url: str = "redis://127.0.0.1:6379/0"
    sandbox_tiers_file: Path = DEFAULT_TIERS_FILE
    # Containers kept warm per tier; a tier in the tiers file may override it.
    sandbox_pool_size: int = 2
    # Tiers that get a warm pool at start (empty = all tiers).
    sandbox_pool_tiers: str = ""
    # Threads building warm containers in parallel, and the most a tier's pool grows to under load.
    sandbox_pool_builders: int = Field(default=3, ge=1, le=32)
    sandbox_pool_max: int = Field(default=16, ge=1, le=256)
    # A warm container unused this long is replaced (a tier may override it with max_idle_s).
    sandbox_max_idle_s: float = Field(default=600.0, gt=0)
    # A container bound to a tenant is retired after this many executions or this age (tiers may
    # override them: max_executions, max_age_s), and a worker keeps at most this many of them idle.
    sandbox_max_executions: int = Field(default=200, ge=1)
    sandbox_max_age_s: float = Field(default=600.0, gt=0)
    sandbox_pool_bound_max: int = Field(default=32, ge=1, le=1024)
    # The sweeper: how often it runs, and the grace past a tier's limits before it kills.
    sandbox_sweep_interval_s: float = Field(default=5.0, gt=0)
    sandbox_sweep_grace_s: float = Field(default=10.0, ge=0)
    # Configured tenants (shared with the worker's REACTQ_TENANTS): the tenant label of the
    # CPU-seconds metric is one of these or "other".
    tenants: list[str] = ["default"]
    # Interpreter the process backend runs (system python, not a virtualenv).
    sandbox_process_python: str = "/usr/bin/python3"
    # How the process backend confines code: bubblewrap, util-linux unshare (root only,
    # for hosts without bwrap), or auto = bwrap when installed, else unshare.
    sandbox_process_confinement: Literal["auto", "bwrap", "unshare"] = "auto"
    # Waiting in line for a slot (tools_sandbox/base/quotas.py): a call whose request names no deadline
    # waits at most this long; a waiting call polls about this often (the Celery task re-queues
    # itself with a countdown of about this, growing with its position up to 5 s); a ticket that
    # has not polled for `sandbox_waiter_stale_s` is dropped from the line (its task vanished).
    sandbox_wait_max_s: float = Field(default=1800.0, ge=0)
    sandbox_wait_poll_s: float = Field(default=0.5, gt=0, le=5)
    sandbox_waiter_stale_s: float = Field(default=30.0, ge=10)
    # How long a waiting call's pending marker (ExecuteRequest.pending_key) outlives its last poll.
    sandbox_pending_ttl_s: int = Field(default=60, ge=15)
    # A call no backend can run is sent back to the queue with a growing delay (another sandbox worker may
    # answer) for this long; then its result is `unavailable` and its run ends failed (sandbox_unavailable).
    sandbox_unavailable_s: float = Field(default=300.0, gt=0)
    # Debian mirror for the offline image build; empty = the one apt uses here.
    sandbox_mirror: str = ""
