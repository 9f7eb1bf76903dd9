"""Recording new runs: their records, their tenants' run indexes and in-flight sets, their batch, and
the admission windows (runs in flight, submissions per minute) checked and counted by the same script,
so that two submitters cannot both take a tenant's last slot."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from ..core.models import Run
from ..errors import QuotaExceeded
from . import keys, replicated
from .batches import batch_keys
from .cas import COMMANDS_FUNCTION, Command, run_commands, script_commands
from .events import event_command
from .scripts import lua


@dataclass(frozen=True)
class Quota:
    """A tenant's admission limits for one submission (worker/tenancy/admission.py), checked and counted by the
    script that records its runs: the check and the runs' entry into the in-flight set are one step."""

    tenant: str
    runs: int
    in_flight: int
    per_minute: int


_CREATE_RUNS = COMMANDS_FUNCTION + lua(__file__, "create_runs.lua")


class SubmissionStore:
    def __init__(self, client: redis.Redis, run_ttl_s: int, batch_ttl_s: int, wait_replicas: int = 1) -> None:
        self.r = client
        self.wait_replicas = wait_replicas
        self.ttl = run_ttl_s
        self.batch_ttl = batch_ttl_s
        self._create = client.register_script(_CREATE_RUNS)

    def create_runs(self, runs: list[Run], batch_id: str | None = None, count_window_s: int | None = None,
                    quotas: list[Quota] | None = None, now: float | None = None) -> dict[str, int]:
        """Record new runs, in one script. With `quotas`, only if each tenant's quota admits its runs
        (QuotaExceeded, nothing written, if one does not). With `count_window_s`, count them into their
        tenants' recent submissions (count_submissions), and return each tenant's count before them.
        `now` (default: the clock) picks the minute they are counted in."""
        if not runs:
            return {}
        now = time.time() if now is None else now
        by_tenant: dict[str, list[Run]] = {}
        for run in runs:
            by_tenant.setdefault(run.spec.tenant, []).append(run)
        records: list[Command] = []
        for run in runs:
            records += [("SET", keys.run(run.id), run.model_dump_json(), "EX", self.ttl),
                        event_command(run.id, "queued", "{}"), ("EXPIRE", keys.events(run.id), self.ttl)]
        active = [c for key, ids in keys.by_active_set(run.id for run in runs).items()
                  for c in _variadic("ZADD", key, [a for run_id in ids for a in (now, run_id)], 2)]
        tenants: dict[str, list[Command]] = {}
        for tenant, group in by_tenant.items():
            tenants[tenant] = [*_variadic("ZADD", keys.tenant_runs(tenant), _scored(group, lambda r: r.created_at), 2),
                               *_variadic("SADD", keys.tenant_inflight(tenant), [r.id for r in group])]
            if count_window_s is not None:
                tenants[tenant] += _count_commands(tenant, len(group), count_window_s, now)
        batch: list[Command] = []
        if batch_id:
            batch = _variadic("RPUSH", keys.batch_runs(batch_id), [r.id for r in runs])
            batch += [("EXPIRE", key, self.batch_ttl) for key in batch_keys(batch_id)]
        quotas = quotas or []
        if keys.hash_tags():
            replies_by_tenant = self._create_on_cluster(by_tenant, records, active, tenants, batch, quotas, now)
        else:
            commands = records + active + [c for written in tenants.values() for c in written] + batch
            replies = self._admit(quotas, commands, now)
            replies_by_tenant, at = {}, len(records) + len(active)
            for tenant, written in tenants.items():
                replies_by_tenant[tenant] = replies[at:at + len(written)]
                at += len(written)
        if count_window_s is None:
            return {}
        return {tenant: _counted_before(replies[-COUNT_COMMANDS:], len(by_tenant[tenant]))
                for tenant, replies in replies_by_tenant.items()}

    def _admit(self, quotas: list[Quota], commands: list[Command], now: float) -> list[Any]:
        """Check and count the quotas and make the writes, in one script; the writes' replies."""
        script_keys = [k for q in quotas for k in (keys.tenant_inflight(q.tenant),
                                                   keys.tenant_submissions(q.tenant, int(now // 60)))]
        args: list[Any] = [len(quotas), *[a for q in quotas for a in (q.runs, q.in_flight, q.per_minute)]]
        args += script_commands(commands, script_keys)
        code, replies = self._create(keys=script_keys, args=args)
        if code != 0:
            raise QuotaExceeded(quotas[replies - 1], "in_flight" if code == -2 else "per_minute")
        return list(replies)

    def _create_on_cluster(self, by_tenant: dict[str, list[Run]], records: list[Command], active: list[Command],
                           tenants: dict[str, list[Command]], batch: list[Command], quotas: list[Quota],
                           now: float) -> dict[str, list[Any]]:
        """The same writes on a Redis Cluster, where they span shards: in an order that leaves every crash
        recoverable (docs/decisions/redis-cluster.md). Each tenant's admission and indexes are one script on
        its shard (refused: what was written is taken back); then the runs' active-set entries and records,
        in their own slots (a run the reaper finds without a step message is sent one; an in-flight entry
        without a record is dropped by `forget_expired_in_flight`), and the batch's lists."""
        admitted: list[str] = []
        replies: dict[str, list[Any]] = {}
        try:
            for tenant, writes in tenants.items():
                replies[tenant] = self._admit([q for q in quotas if q.tenant == tenant], writes, now)
                admitted.append(tenant)
        except QuotaExceeded:
            undo: list[Command] = []
            for tenant in admitted:
                ids = [r.id for r in by_tenant[tenant]]
                undo += [("SREM", keys.tenant_inflight(tenant), *ids), ("ZREM", keys.tenant_runs(tenant), *ids)]
            run_commands(self.r, undo)
            raise
        # on a replica before a step reads them
        replicated.run_commands(self.r, active + records, self.wait_replicas)  # type: ignore[arg-type]
        run_commands(self.r, batch)
        return replies

    def forget_expired_in_flight(self, tenant: str) -> None:
        """Drop a tenant's in-flight entries whose run record has expired (a run that never finished)."""
        inflight = keys.tenant_inflight(tenant)
        ids = [i.decode() for i in self.r.smembers(inflight)]
        pipe = self.r.pipeline(transaction=False)
        for run_id in ids:
            pipe.exists(keys.run(run_id))
        gone = [run_id for run_id, alive in zip(ids, pipe.execute(), strict=True) if not alive]
        if gone:
            self.r.srem(inflight, *gone)

    def count_submissions(self, tenant: str, count: int, window_s: int, now: float | None = None) -> int:
        """Add `count` to the tenant's submissions of this minute; return its total over the last
        `window_s` before them (one-minute buckets that expire; worker/tenancy/fairness.py). Submissions are
        counted by create_runs, with the same commands; this one takes `now`, for tests of the window."""
        return _counted_before(run_commands(self.r, _count_commands(tenant, count, window_s, now)), count)


COUNT_COMMANDS = 3  # what _count_commands gives


def _count_commands(tenant: str, count: int, window_s: int, now: float | None) -> list[Command]:
    """Add `count` to the tenant's one-minute submission bucket, and read the window's older buckets."""
    minute = int((now or time.time()) // 60)
    buckets = [keys.tenant_submitted(tenant, minute - i) for i in range(max(2, window_s // 60))]
    return [("INCRBY", buckets[0], count), ("EXPIRE", buckets[0], window_s + 60), ("MGET", *buckets[1:])]


def _variadic(name: str, key: str, args: list[Any], per_member: int = 1) -> list[Command]:
    """One command over many members as several of at most 1,000 members each: the script passes a
    command's arguments through Lua's `unpack`, which fails past about 8,000 values (a 10,000-run batch)."""
    step = 1000 * per_member
    return [(name, key, *args[i:i + step]) for i in range(0, len(args), step)]


def _scored(runs: list[Run], score: Callable[[Run], float]) -> list[Any]:
    """ZADD's score-member arguments for these runs."""
    return [a for run in runs for a in (score(run), run.id)]


def _counted_before(replies: list[Any], count: int) -> int:
    """The tenant's submissions in the window before these `count`, from _count_commands' replies."""
    total_now, _, older = replies
    return int(total_now) - count + sum(int(v) for v in older if v)
