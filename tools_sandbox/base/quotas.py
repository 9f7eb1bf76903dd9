"""Per-tenant, per-tier quotas shared by every sandbox worker through Redis: a rate is a line, not a refusal.

Three quotas, checked atomically in one Lua script before an execution starts:
- concurrent_executions: a sorted set of slots scored by their expiry time (the tier's wall time plus a
  grace). A worker that crashes never releases its slot, so expired slots are dropped on every check: a
  slot can't outlive its execution by more than the grace, with no reaper needed. A slot's id is the
  call's ticket, so a duplicate of a call that is executing (a redelivery, a re-sent call) is told so
  (`in_progress`) and never runs the code a second time alongside it.
- executions_per_minute: a counter per wall-clock minute (fixed window).
- cpu_seconds_per_day: a float counter per UTC day, charged after each execution with the CPU time it
  used (or wall time x CPUs when the sandbox had to be killed). The only quota that refuses a call.

A call over the first two quotas WAITS in its (tier, tenant)'s line: a sorted set of tickets scored by
the call's arrival time (the same ticket keeps its place however often it polls), beside a sorted set of
when each ticket last polled. A slot goes only to a ticket whose rank in the line is below both the free
concurrency and what is left of this minute's executions, so the line is first come, first served. A
ticket not seen for `waiter_stale_s` (its task vanished) is dropped from the line, so a dead waiter never
blocks the ones behind it; should it come back, it re-enters at its arrival time. `acquire` answers a
`Slot`, a `Wait` (which quota, the ticket's position, when to look again) or a `Rejection` (the CPU day).

A waiting Celery call is *parked*: its request is left in a hash beside the line (`park`), and no
message of it waits in the broker. `wake` hands back the requests of as many calls at the head of the
line as there is capacity free (minus those woken but not yet arrived), and of every parked call whose
deadline passed; the sandbox task calls it after each execution it finishes, and each sandbox worker
process every second (edges/sandbox_worker.py), so a freed slot is taken within milliseconds, in order.
Parked and just-woken tickets never count as gone quiet. A step about to send a call asks `enter` first: a
call whose turn has not come is parked by the step itself (no message, no delivery that would only park it),
and one it sends counts as woken until it arrives.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.commands.core import Script

from . import keys
from .calls import connect
from .models import Tier

SLOT_GRACE_S = 30
WAITER_STALE_S = 30.0
# A duplicate of a call that holds a slot waits (as this quota) for the other's result.
IN_PROGRESS = "in_progress"

# KEYS: running, minute, cpu day, line, seen, parked, woken
# ARGV: now, ticket, slot ttl, concurrent, per minute, cpu per day, minute reset, day reset, arrival, stale
_ACQUIRE = (Path(__file__).parent / "acquire_slot.lua").read_text()

# Wake the calls at the head of a line for the capacity free now (and every parked call whose deadline
# passed), taking their requests out of the parked hash: each is woken exactly once.
# KEYS: running, minute, line, parked, parked deadlines, woken, parked lines
# ARGV: now, concurrent, per minute, woken ttl, line name (for parked lines), scan limit
_WAKE = (Path(__file__).parent / "wake_line.lua").read_text()
WOKEN_TTL_S = 10.0

# A call as its step sends it: 'send' (counted as woken until it arrives) or 'parked' (see QuotaGate.enter).
# KEYS: running, minute, line, parked, parked deadlines, woken, parked lines, seen
# ARGV: now, ticket, concurrent, per minute, arrival, request, deadline, woken ttl, line name, stale, keep
_ENTER = (Path(__file__).parent / "enter_line.lua").read_text()


@dataclass(frozen=True)
class Rejection:
    """Which quota refused the call (only `cpu_seconds_per_day` does), and in how many seconds it frees up."""

    quota: str
    tenant: str
    tier: str
    resets_in_s: int

    def message(self) -> str:
        return (f"quota_exceeded: {self.quota} for tenant {self.tenant} on tier {self.tier}; "
                f"resets in {self.resets_in_s}s")


@dataclass(frozen=True)
class Wait:
    """The call waits in line: which quota holds it, how many tickets are ahead, and about when a slot
    may free (`retry_in_s`, a hint: the ticket must poll before `waiter_stale_s` anyway)."""

    quota: str
    tenant: str
    tier: str
    position: int
    retry_in_s: float

    def gave_up(self) -> str:
        """The error a call gets when its run's deadline passes while it waits."""
        return (f"quota_exceeded: the run's deadline passed while waiting for a sandbox slot ({self.quota} "
                f"for tenant {self.tenant} on tier {self.tier}); the code did not run")


@dataclass(frozen=True)
class Slot:
    """A granted execution; hand it back to QuotaGate.release when the execution ends."""

    tier: str
    tenant: str
    slot_id: str


class QuotaGate:
    """Acquire/release of quota slots on one Redis; construct, then call start(). Given a `client`, it uses
    that one (its owner closes it), else it connects to `redis_url`."""

    def __init__(self, redis_url: str = "", *, client: redis.Redis | None = None,
                 waiter_stale_s: float = WAITER_STALE_S) -> None:
        self.redis_url = redis_url
        self.waiter_stale_s = waiter_stale_s
        self._given = client
        self._client: redis.Redis | None = None
        self._acquire: Script | None = None
        self._wake: Script | None = None
        self._enter: Script | None = None

    def start(self) -> None:
        self._client = self._given or connect(self.redis_url, socket_timeout=5)
        self._acquire = self._client.register_script(_ACQUIRE)
        self._wake = self._client.register_script(_WAKE)
        self._enter = self._client.register_script(_ENTER)

    def close(self) -> None:
        if self._client is not None and self._given is None:
            self._client.close()
        self._client = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            raise RuntimeError("QuotaGate.start() was not called")
        return self._client

    def acquire(self, tier: Tier, tenant: str, *, ticket: str | None = None, arrival: float | None = None,
                now: float | None = None) -> Slot | Wait | Rejection:
        """Take a slot for the call `ticket` (arrived at `arrival`: its place in line), or say why it waits
        or is refused. Poll again with the same ticket and arrival until it is not a Wait (or `leave`)."""
        now = time.time() if now is None else now
        arrival = now if arrival is None else arrival
        ticket = ticket or uuid.uuid4().hex
        minute, day = int(now // 60), int(now // 86400)
        assert self._acquire is not None
        verdict, wait, rank = self._acquire(
            keys=[keys.quota_running(tier.name, tenant), keys.quota_minute(tier.name, tenant, minute),
                  keys.quota_cpu_day(tier.name, tenant, day), keys.quota_line(tier.name, tenant),
                  keys.quota_seen(tier.name, tenant), keys.quota_parked(tier.name, tenant),
                  keys.quota_woken(tier.name, tenant)],
            args=[repr(now), ticket, tier.wall_time_s + SLOT_GRACE_S, tier.quota.concurrent_executions,
                  tier.quota.executions_per_minute, tier.quota.cpu_seconds_per_day,
                  math.ceil((minute + 1) * 60 - now), math.ceil((day + 1) * 86400 - now), repr(arrival),
                  self.waiter_stale_s],
            client=self.client,
        )
        verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
        if verdict == "ok":
            return Slot(tier=tier.name, tenant=tenant, slot_id=ticket)
        if verdict == "cpu_seconds_per_day":
            return Rejection(quota=verdict, tenant=tenant, tier=tier.name, resets_in_s=max(1, math.ceil(float(wait))))
        return Wait(quota=verdict, tenant=tenant, tier=tier.name, position=int(rank),
                    retry_in_s=max(0.0, float(wait)))

    def enter(self, tier: Tier, tenant: str, *, ticket: str, arrival: float, request: str, deadline: float,
              now: float | None = None) -> bool:
        """Whether a call its step is about to send should go now: its place in line is within the capacity
        free (it counts as woken until its delivery takes the slot). Otherwise it is parked with `request`
        (a delivery would only have parked it), and `wake` sends it when its turn comes."""
        now = time.time() if now is None else now
        assert self._enter is not None
        verdict = self._enter(
            keys=[*_line_keys(tier.name, tenant, now), keys.quota_seen(tier.name, tenant)],
            args=[repr(now), ticket, tier.quota.concurrent_executions, tier.quota.executions_per_minute,
                  repr(arrival), request, repr(deadline), WOKEN_TTL_S, f"{tier.name}\t{tenant}", self.waiter_stale_s,
                  _parked_ttl_s(deadline, now)],
            client=self.client,
        )
        return (verdict.decode() if isinstance(verdict, bytes) else verdict) == "send"

    def park(self, tier: str, tenant: str, ticket: str, request: str, deadline: float) -> None:
        """Leave a waiting call's request with its line: `wake` hands it back when its turn (or its
        deadline) comes, so no message of it waits in the broker meanwhile."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(keys.quota_parked(tier, tenant), ticket, request)
        pipe.zadd(keys.quota_parked_deadlines(tier, tenant), {ticket: deadline})
        pipe.zrem(keys.quota_woken(tier, tenant), ticket)
        pipe.sadd(keys.parked_lines(), f"{tier}\t{tenant}")
        for key in (keys.quota_parked(tier, tenant), keys.quota_parked_deadlines(tier, tenant)):
            pipe.expire(key, _parked_ttl_s(deadline, time.time()))
        pipe.execute()

    def wake(self, tier: Tier, tenant: str, *, now: float | None = None, scan: int = 100) -> list[bytes]:
        """The requests of the parked calls whose turn has come (as many as the free capacity, first in
        line first) and of those whose deadline passed; each is handed out once, to be sent again."""
        now = time.time() if now is None else now
        assert self._wake is not None
        woken = self._wake(
            keys=_line_keys(tier.name, tenant, now),
            args=[repr(now), tier.quota.concurrent_executions, tier.quota.executions_per_minute, WOKEN_TTL_S,
                  f"{tier.name}\t{tenant}", scan],
            client=self.client,
        )
        return list(woken)

    def parked(self, tier: str, tenant: str) -> list[bytes]:
        """The requests parked in a line (for their pending markers, and tests)."""
        return list(self.client.hvals(keys.quota_parked(tier, tenant)))

    def parked_count(self, tier: str, tenant: str) -> int:
        return int(self.client.hlen(keys.quota_parked(tier, tenant)))

    def parked_lines(self) -> list[tuple[str, str]]:
        """(tier, tenant) of every line with parked calls."""
        lines = [m.decode().split("\t", 1) for m in self.client.smembers(keys.parked_lines())]
        return [(line[0], line[1]) for line in lines if len(line) == 2]

    def leave(self, tier: str, tenant: str, ticket: str) -> None:
        """Take a ticket out of the line (its call ended without a slot: deadline, failure)."""
        pipe = self.client.pipeline(transaction=True)
        for key in (keys.quota_line(tier, tenant), keys.quota_seen(tier, tenant), keys.quota_woken(tier, tenant),
                    keys.quota_parked_deadlines(tier, tenant)):
            pipe.zrem(key, ticket)
        pipe.hdel(keys.quota_parked(tier, tenant), ticket)
        pipe.execute()

    def waiting(self, tier: str, tenant: str) -> list[str]:
        """The tickets in line, first first (for tests and operators)."""
        return [t.decode() for t in self.client.zrange(keys.quota_line(tier, tenant), 0, -1)]

    def release(self, slot: Slot, cpu_seconds: float, *, now: float | None = None) -> None:
        """Free the concurrency slot and charge the CPU time used to today's counter."""
        now = time.time() if now is None else now
        day_key = keys.quota_cpu_day(slot.tier, slot.tenant, int(now // 86400))
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(keys.quota_running(slot.tier, slot.tenant), slot.slot_id)
        pipe.incrbyfloat(day_key, max(cpu_seconds, 0.0))
        pipe.expire(day_key, 2 * 86400)
        pipe.execute()


def _parked_ttl_s(deadline: float, now: float) -> int:
    """How long a line's parked requests are kept: an hour past the latest deadline (each park renews it)."""
    return max(60, int(deadline - now) + 3600)


def _line_keys(tier: str, tenant: str, now: float) -> list[str]:
    """The keys of a line's wake (and, with its `seen` after them, of a step's entry): running, minute, line,
    parked, parked deadlines, woken, parked lines."""
    return [keys.quota_running(tier, tenant), keys.quota_minute(tier, tenant, int(now // 60)),
            keys.quota_line(tier, tenant), keys.quota_parked(tier, tenant), keys.quota_parked_deadlines(tier, tenant),
            keys.quota_woken(tier, tenant), keys.parked_lines()]
