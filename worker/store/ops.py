"""What the operations page reads from Redis, in a few round trips: every queue's list per priority, the
unacked messages, live workers per queue, active runs, the provider limiter's cells and cool-downs on
Redis's clock, and the metric snapshots the worker processes publish (worker/runtime/ops_snapshot.py).
The page's figures are made from these by worker/core/ops_view.py (pure)."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from ..core.ops_view import LimiterCells, OpsRaw
from ..names import QUEUES, WEBHOOKS_QUEUE, queue_lists
from . import keys
from .connection import mget

__all__ = ["OpsStore", "WATCHED"]

WATCHED = (*QUEUES, WEBHOOKS_QUEUE)
REAPER_KEPT = 50


class OpsStore:
    """`broker`: the Celery broker's Redis (queue lists, unacked), the state client unless it is apart."""

    def __init__(self, client: redis.Redis, broker: redis.Redis | None = None) -> None:
        self.r = client
        self.broker = broker if broker is not None else client

    def publish(self, member: str, snapshot: dict[str, Any], ttl_s: float) -> None:
        """One worker process's metrics now (kept `ttl_s`: a dead worker's figures drop out)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.set(keys.worker_snapshot(member), json.dumps(snapshot, separators=(",", ":")), px=int(ttl_s * 1000))
        pipe.zadd(keys.WORKER_SNAPSHOTS, {member: time.time()})
        pipe.zremrangebyscore(keys.WORKER_SNAPSHOTS, "-inf", time.time() - 3600)
        pipe.execute()

    def note_reaper_action(self, run_id: str, step: int, action: str) -> None:
        """One thing the reaper did to a run (not `dropped`): the page lists the latest REAPER_KEPT."""
        entry = json.dumps({"at": time.time(), "run_id": run_id, "step": step, "action": action})
        pipe = self.r.pipeline(transaction=False)
        pipe.lpush(keys.REAPER_RECENT, entry)
        pipe.ltrim(keys.REAPER_RECENT, 0, REAPER_KEPT - 1)
        pipe.expire(keys.REAPER_RECENT, 7 * 86400)
        pipe.execute()

    def read(self, models: list[str], live_within_s: float = 45) -> OpsRaw:
        now = time.time()
        lists = self.broker.pipeline(transaction=False)
        for queue in WATCHED:
            for name in queue_lists(queue):
                lists.llen(name)
        lists.hlen(keys.CELERY_UNACKED)
        queued = iter(lists.execute())
        pipe = self.r.pipeline(transaction=False)
        pipe.time()
        for queue in WATCHED:
            pipe.zcount(keys.workers(queue), now - live_within_s, "+inf")
        if keys.hash_tags():  # the count of the last reaper pass (ClusterStore.active_count)
            pipe.get(keys.ACTIVE_COUNT)
        else:
            pipe.zcard(keys.ACTIVE_RUNS)
        for model in models:
            pipe.get(keys.llm_limit(model, "rpm"))
            pipe.get(keys.llm_limit(model, "tpm"))
            pipe.pttl(keys.llm_cooldown(model))
            pipe.pttl(keys.llm_circuit(model))
        pipe.lrange(keys.REAPER_RECENT, 0, REAPER_KEPT - 1)
        pipe.zrangebyscore(keys.WORKER_SNAPSHOTS, now - 3600, "+inf")
        replies = iter(pipe.execute())
        seconds, micros = next(replies)
        queues = {queue: [int(next(queued)) for _ in queue_lists(queue)] for queue in WATCHED}
        unacked = int(next(queued))
        workers = {queue: int(next(replies)) for queue in WATCHED}
        active = int(next(replies) or 0)
        limiters = []
        for model in models:
            rpm, tpm, cooldown, circuit = next(replies), next(replies), int(next(replies)), int(next(replies))
            limiters.append(LimiterCells(model, float(rpm) if rpm else None, float(tpm) if tpm else None,
                                         max(0, cooldown), max(0, circuit)))
        reaped = [json.loads(raw) for raw in next(replies)]
        members = [m.decode() for m in next(replies)]
        raws = mget(self.r, [keys.worker_snapshot(m) for m in members])
        snapshots = [json.loads(raw) for raw in raws if raw]
        return OpsRaw(now, seconds * 1e6 + micros, queues, unacked, workers, active, limiters, snapshots, reaped)
