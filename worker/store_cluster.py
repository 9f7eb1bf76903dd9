"""The cluster's own Redis state, beside the runs' (worker/store.py): worker heartbeats, the reaper's
lock, queue depths. The reaper and `reactq demo` reach Redis only through here."""

from __future__ import annotations

import time

import redis

from . import keys
from .fairness import queue_lists
from .names import QUEUES


class ClusterStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def heartbeat(self, queues: list[str], member: str, forget_after_s: float = 3600) -> None:
        """Say that worker `member` consumes `queues` now (and forget members silent for an hour)."""
        pipe = self.r.pipeline(transaction=False)
        now = time.time()
        for queue in queues:
            pipe.zadd(keys.workers(queue), {member: now})
            pipe.zremrangebyscore(keys.workers(queue), "-inf", now - forget_after_s)
        pipe.execute()

    def live_workers(self, queue: str, within_s: float = 45) -> int:
        return int(self.r.zcount(keys.workers(queue), time.time() - within_s, "+inf"))

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each reactq queue (the broker's lists: one per priority, worker/fairness.py)."""
        pipe = self.r.pipeline(transaction=False)
        for queue in QUEUES:
            for name in queue_lists(queue):
                pipe.llen(name)
        counts = iter(pipe.execute())
        return {queue: sum(next(counts) for _ in queue_lists(queue)) for queue in QUEUES}

    def take_reaper_turn(self, interval_s: float) -> bool:
        """True for at most one caller in the cluster per interval."""
        return bool(self.r.set(keys.REAPER_LOCK, "1", nx=True, ex=max(1, int(interval_s))))
