"""Prometheus metrics of the sandbox (names and labels fixed by DESIGN.md)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Histogram

OUTCOMES = ("ok", "error", "timeout", "oom", "truncated", "quota_exceeded", "unavailable")
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


def init_labels(tiers: Iterable[str]) -> None:
    """Create every known label set at 0 so dashboards and rate() see the series from the start."""
    for tier in tiers:
        DURATION.labels(tier=tier)
        for outcome in OUTCOMES:
            EXECUTIONS.labels(tier=tier, outcome=outcome)
        for quota in QUOTAS:
            QUOTA_REJECTIONS.labels(tier=tier, quota=quota)


def tier_label(tier: str, known: Iterable[str]) -> str:
    """Only configured tier names become label values."""
    return tier if tier in set(known) else "other"
