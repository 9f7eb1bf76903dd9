"""Prometheus metrics of the sandbox (names and labels fixed by docs/DESIGN.md)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from .models import ErrorKind, ReapReason

# `ok`, `error` (the program exited non-zero) and the error kinds; only `unavailable` is ours.
OUTCOMES = ("ok", "error", *(kind.value for kind in ErrorKind))
QUOTAS = ("concurrent_executions", "executions_per_minute", "cpu_seconds_per_day")

EXECUTIONS = Counter(
    "reactq_sandbox_executions_total", "Sandbox executions by tier and outcome", ["tier", "outcome"],
)
DURATION = Histogram(
    "reactq_sandbox_duration_seconds", "End-to-end sandbox execution time", ["tier"],
    buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
QUOTA_REJECTIONS = Counter(
    "reactq_quota_rejections_total", "Sandbox calls refused by a tenant quota", ["tier", "quota"],
)
CPU_SECONDS = Counter(
    "reactq_sandbox_cpu_seconds_total", "CPU seconds used by sandboxed code, measured by the host",
    ["tier", "tenant"],
)
REAPED = Counter(
    "reactq_sandbox_reaped_total", "Sandbox containers killed and removed by the sweeper", ["reason"],
)
# Why the warm pool stopped using a container: an anomaly of the execution (timeout, oom, protocol,
# unclean, ...), its tier's max executions or age, idle too long, surplus to its tenant, evicted (LRU).
RETIRED = Counter(
    "reactq_sandbox_retired_total", "Warm sandbox containers the pool retired", ["reason"],
)


# Warm containers one sandbox worker process holds ready per tier: `unbound` (started, no tenant yet) and
# `bound` (idle, serving one tenant again when it calls).
WARM = Gauge(
    "reactq_sandbox_warm_containers", "Idle warm sandbox containers of this process", ["tier", "state"],
)
# Calls parked in line for a slot, cluster-wide (every sandbox worker reports the same figure: use max()).
CALLS_WAITING = Gauge(
    "reactq_sandbox_calls_waiting", "Sandbox calls waiting in line for a slot of their tenant's quota", ["tier"],
)

# 1 while this process's sandbox backend can run code, 0 while it cannot (it then takes no sandbox tasks);
# `backend` is the configured choice (docker, process, auto).
BACKEND_UP = Gauge(
    "reactq_sandbox_backend_up", "Whether this sandbox worker's backend can run code (1) or not (0)", ["backend"],
)


def init_labels(tiers: Iterable[str], tenants: Iterable[str] = ()) -> None:
    """Create every known label set at 0 so dashboards and rate() see the series from the start."""
    for reason in ReapReason:
        REAPED.labels(reason=reason.value)
    tenants = list(tenants)
    for tier in tiers:
        for tenant in [*tenants, "other"]:
            CPU_SECONDS.labels(tier=tier, tenant=tenant)
        DURATION.labels(tier=tier)
        for outcome in OUTCOMES:
            EXECUTIONS.labels(tier=tier, outcome=outcome)
        for quota in QUOTAS:
            QUOTA_REJECTIONS.labels(tier=tier, quota=quota)


def tier_label(tier: str, known: Iterable[str]) -> str:
    """Only configured tier names become label values."""
    return tier if tier in set(known) else "other"


def tenant_label(tenant: str, configured: Iterable[str]) -> str:
    """Only configured tenants become label values (the same rule as the worker's token metrics)."""
    return tenant if tenant in set(configured) else "other"
