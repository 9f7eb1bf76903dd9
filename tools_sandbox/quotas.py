"""Per-tenant, per-tier quotas shared by every sandbox worker through Redis.

Three quotas, checked atomically in one Lua script before an execution starts:
- concurrent_executions: a sorted set of slots scored by their expiry time (the
  tier's wall time plus a grace). A worker that crashes never releases its slot, so
  expired slots are dropped on every check: a slot can't outlive its execution by
  more than the grace, with no reaper needed.
- executions_per_minute: a counter per wall-clock minute (fixed window).
- cpu_seconds_per_day: a float counter per UTC day, charged after each execution
  with the CPU time it used (or wall time x CPUs when the sandbox had to be killed).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

import redis
from redis.commands.core import Script

from . import keys
from .models import Tier

SLOT_GRACE_S = 30
_ACQUIRE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {'concurrent_executions', tostring(tonumber(first[2]) - now)}
end
if tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[6]) then
  return {'cpu_seconds_per_day', ARGV[8]}
end
if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[5]) then
  return {'executions_per_minute', ARGV[7]}
end
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], 120)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 60)
return {'ok', '0'}
"""


@dataclass(frozen=True)
class Rejection:
    """Which quota refused the call, and in how many seconds it frees up."""

    quota: str
    tenant: str
    tier: str
    resets_in_s: int

    def message(self) -> str:
        return (f"quota_exceeded: {self.quota} for tenant {self.tenant} on tier {self.tier}; "
                f"resets in {self.resets_in_s}s")


@dataclass(frozen=True)
class Slot:
    """A granted execution; hand it back to QuotaGate.release when the execution ends."""

    tier: str
    tenant: str
    slot_id: str


class QuotaGate:
    """Acquire/release of quota slots on one Redis; construct, then call start()."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self._client: redis.Redis | None = None
        self._acquire: Script | None = None

    def start(self) -> None:
        self._client = redis.Redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=5)
        self._acquire = self._client.register_script(_ACQUIRE)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            raise RuntimeError("QuotaGate.start() was not called")
        return self._client

    def acquire(self, tier: Tier, tenant: str, *, now: float | None = None) -> Slot | Rejection:
        """Take a slot for one execution, or say which quota refuses and when it resets."""
        now = time.time() if now is None else now
        minute, day = int(now // 60), int(now // 86400)
        slot_id = uuid.uuid4().hex
        assert self._acquire is not None
        verdict, wait = self._acquire(
            keys=[keys.quota_running(tier.name, tenant), keys.quota_minute(tier.name, tenant, minute),
                  keys.quota_cpu_day(tier.name, tenant, day)],
            args=[repr(now), slot_id, tier.wall_time_s + SLOT_GRACE_S, tier.quota.concurrent_executions,
                  tier.quota.executions_per_minute, tier.quota.cpu_seconds_per_day,
                  math.ceil((minute + 1) * 60 - now), math.ceil((day + 1) * 86400 - now)],
            client=self.client,
        )
        verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
        if verdict == "ok":
            return Slot(tier=tier.name, tenant=tenant, slot_id=slot_id)
        resets = max(1, math.ceil(float(wait)))
        return Rejection(quota=verdict, tenant=tenant, tier=tier.name, resets_in_s=resets)

    def release(self, slot: Slot, cpu_seconds: float, *, now: float | None = None) -> None:
        """Free the concurrency slot and charge the CPU time used to today's counter."""
        now = time.time() if now is None else now
        day_key = keys.quota_cpu_day(slot.tier, slot.tenant, int(now // 86400))
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(keys.quota_running(slot.tier, slot.tenant), slot.slot_id)
        pipe.incrbyfloat(day_key, max(cpu_seconds, 0.0))
        pipe.expire(day_key, 2 * 86400)
        pipe.execute()
