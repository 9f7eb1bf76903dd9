"""Every Redis key tools_sandbox uses, in one place."""

from __future__ import annotations

PREFIX = "reactq:sandbox"
_QUOTA = "quota"  # on a Redis Cluster: "{quota}", one hash tag for every quota key (use_hash_tags)


def use_hash_tags(on: bool) -> None:
    """On a Redis Cluster every quota key shares one hash tag, so the quota scripts and transactions (which
    touch a line's keys and the index of lines together) run on one shard: a few commands per sandboxed
    call. A single Redis keeps the names it always had."""
    global _QUOTA
    _QUOTA = "{quota}" if on else "quota"


def quota_running(tier: str, tenant: str) -> str:
    """Sorted set of in-flight execution slots, scored by the time each slot expires."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:running"


def quota_minute(tier: str, tenant: str, minute: int) -> str:
    """Executions started in one wall-clock minute (epoch minutes)."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:minute:{minute}"


def quota_cpu_day(tier: str, tenant: str, day: int) -> str:
    """CPU-seconds used in one UTC day (epoch days), a float counter."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:cpu:{day}"


def quota_line(tier: str, tenant: str) -> str:
    """Sorted set of the calls waiting for a slot (tickets), scored by their arrival: the line, FIFO."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:line"


def quota_seen(tier: str, tenant: str) -> str:
    """Sorted set of the same tickets scored by when each last polled: a ticket gone quiet leaves the line."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:seen"


def quota_parked(tier: str, tenant: str) -> str:
    """Hash of the waiting calls' requests (ticket -> request JSON): they wait here, not in the broker."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:parked"


def quota_parked_deadlines(tier: str, tenant: str) -> str:
    """Sorted set of the parked tickets scored by their run's deadline (woken then, to end in a result)."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:parked-deadlines"


def quota_woken(tier: str, tenant: str) -> str:
    """Sorted set of tickets woken (sent again) but not yet admitted, scored by when: they hold a place."""
    return f"{PREFIX}:{_QUOTA}:{tier}:{tenant}:woken"


def parked_lines() -> str:
    """Set of the lines that have parked calls ("tier\ttenant"): what each sandbox worker's pump looks at."""
    return f"{PREFIX}:{_QUOTA}:parked-lines"
