"""Every Redis key tools_sandbox uses, in one place."""

from __future__ import annotations

PREFIX = "reactq:sandbox"


def quota_running(tier: str, tenant: str) -> str:
    """Sorted set of in-flight execution slots, scored by the time each slot expires."""
    return f"{PREFIX}:quota:{tier}:{tenant}:running"


def quota_minute(tier: str, tenant: str, minute: int) -> str:
    """Executions started in one wall-clock minute (epoch minutes)."""
    return f"{PREFIX}:quota:{tier}:{tenant}:minute:{minute}"


def quota_cpu_day(tier: str, tenant: str, day: int) -> str:
    """CPU-seconds used in one UTC day (epoch days), a float counter."""
    return f"{PREFIX}:quota:{tier}:{tenant}:cpu:{day}"


def quota_line(tier: str, tenant: str) -> str:
    """Sorted set of the calls waiting for a slot (tickets), scored by their arrival: the line, FIFO."""
    return f"{PREFIX}:quota:{tier}:{tenant}:line"


def quota_seen(tier: str, tenant: str) -> str:
    """Sorted set of the same tickets scored by when each last polled: a ticket gone quiet leaves the line."""
    return f"{PREFIX}:quota:{tier}:{tenant}:seen"
