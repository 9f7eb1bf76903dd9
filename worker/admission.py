"""Admission control per tenant, from its plan: budgets already spent, runs in flight, submissions
per minute (checked before a submission writes anything), and open event streams.

Refusals are `AdmissionRefused` carrying when to try again: the HTTP API answers 429 with
`Retry-After`, `reactq batch` waits that long and goes on.
"""

from __future__ import annotations

import time
import uuid

import redis
from redis import asyncio as aioredis

from . import keys
from .budgets import TenantBudgets
from .errors import ReactqError
from .tenants import Policy

INFLIGHT_RETRY_S = 5  # no clock says when a run will finish: ask again soon
STREAM_LEASE_S = 60  # an open stream renews its slot on every keep-alive (15 s); a dead API process's lapse


class AdmissionRefused(ReactqError):
    """A submission or stream the tenant's plan does not admit now; `retry_after_s` says when to retry."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)


class TooLarge(ReactqError):
    """A submission that can never be admitted as it is (more runs than the plan has in flight)."""


OVER_PER_MINUTE, OVER_IN_FLIGHT = -1, -2
# KEYS: the tenant's in-flight set, the minute's counter. ARGV: runs to add, in-flight limit, per-minute
# limit. Counts the runs into the minute and returns the minute's new count, unless over a limit.
_ADMIT = """
local adding = tonumber(ARGV[1])
if redis.call('scard', KEYS[1]) + adding > tonumber(ARGV[2]) then return -2 end
local now = tonumber(redis.call('get', KEYS[2]) or '0')
if now + adding > tonumber(ARGV[3]) then return -1 end
redis.call('incrby', KEYS[2], adding)
redis.call('expire', KEYS[2], 120)
return now + adding
"""


def admit(client: redis.Redis, policy: Policy, count: int, now: float | None = None) -> None:
    """Raise AdmissionRefused (or TooLarge) unless `count` new runs of the tenant may be submitted now.
    On success the runs are counted against the minute's submissions."""
    now = now or time.time()
    tenant, limits = policy.tenant, policy.plan.limits
    over = TenantBudgets(client).over(tenant, policy.budgets, now)
    if over is not None:
        raise AdmissionRefused(over.message(tenant), int(over.resets_at - now) + 1)
    if count > limits.runs_in_flight:
        raise TooLarge(f"{count} runs in one submission; plan {policy.plan.name!r} allows "
                       f"{limits.runs_in_flight} runs in flight: submit them in smaller parts")
    if count > limits.submissions_per_minute:
        raise TooLarge(f"{count} runs in one submission; plan {policy.plan.name!r} allows "
                       f"{limits.submissions_per_minute} submissions per minute: submit them in smaller parts")
    inflight = keys.tenant_inflight(tenant)
    script = client.register_script(_ADMIT)  # EVALSHA: the script's text is sent once per server
    script_keys = [inflight, keys.tenant_submissions(tenant, int(now // 60))]
    args = [count, limits.runs_in_flight, limits.submissions_per_minute]
    admitted = script(keys=script_keys, args=args)
    if admitted == OVER_IN_FLIGHT:
        _forget_expired(client, inflight)
        admitted = script(keys=script_keys, args=args)
    if admitted == OVER_IN_FLIGHT:
        raise AdmissionRefused(f"tenant {tenant!r} has {limits.runs_in_flight} runs in flight, the limit "
                               f"of plan {policy.plan.name!r}; submit more as they finish", INFLIGHT_RETRY_S)
    if admitted == OVER_PER_MINUTE:
        raise AdmissionRefused(f"tenant {tenant!r} reached {limits.submissions_per_minute} submissions per "
                               f"minute, the limit of plan {policy.plan.name!r}", int(60 - now % 60) + 1)


def _forget_expired(client: redis.Redis, inflight: str) -> None:
    """Drop in-flight entries whose run record has expired (a run that never finished)."""
    ids = [i.decode() for i in client.smembers(inflight)]
    pipe = client.pipeline(transaction=False)
    for run_id in ids:
        pipe.exists(keys.run(run_id))
    gone = [run_id for run_id, alive in zip(ids, pipe.execute(), strict=True) if not alive]
    if gone:
        client.srem(inflight, *gone)


# --- event streams -------------------------------------------------------------------------------
# KEYS: the tenant's streams zset. ARGV: now, lease end, limit, stream id. 1 = opened, 0 = at the cap.
_OPEN_STREAM = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
if redis.call('zcard', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('zadd', KEYS[1], ARGV[2], ARGV[4])
redis.call('expire', KEYS[1], 3600)
return 1
"""


class StreamSlot:
    """One open event stream of a tenant, counted in Redis across every API process."""

    def __init__(self, client: aioredis.Redis, policy: Policy) -> None:
        self.client = client
        self.key = keys.tenant_streams(policy.tenant)
        self.policy = policy
        self.id = uuid.uuid4().hex

    async def open(self) -> None:
        now = time.time()
        limit = self.policy.plan.limits.sse_streams
        if not await self.client.eval(_OPEN_STREAM, 1, self.key, now, now + STREAM_LEASE_S, limit, self.id):
            raise AdmissionRefused(f"tenant {self.policy.tenant!r} has {limit} event streams open, the limit of "
                                   f"plan {self.policy.plan.name!r}; close one first", 5)

    async def renew(self) -> None:
        await self.client.zadd(self.key, {self.id: time.time() + STREAM_LEASE_S}, xx=True)

    async def close(self) -> None:
        await self.client.zrem(self.key, self.id)
