"""A sandbox call's records in Redis: its stored result and its pending marker (the keys are the request's).

The result is stored once (SET NX: a redelivered call never overwrites the answer its run may have read) and
kept a week; the marker tells the run's reaper the call is alive while it waits or runs, and is only ever
extended (keep_pending.lua). Uses the client it is given: a sandbox worker's one Redis client, shared with
its quota gate (edges/sandbox_worker.py).
"""

from __future__ import annotations

from pathlib import Path

import redis

from . import keys
from .models import SandboxResult
from .request import ExecuteRequest

RESULT_TTL_S = 7 * 24 * 3600
# What a Redis that does not answer raises (the task retries the delivery a while, then leaves it to the reaper).
UNREACHABLE: tuple[type[Exception], ...] = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
_KEEP_PENDING = (Path(__file__).parent / "keep_pending.lua").read_text()


def connect(redis_url: str, socket_timeout: float = 10) -> redis.Redis:
    """A sandbox worker's Redis client (its quota gate's and its calls'); a Redis Cluster's for a
    redis+cluster:// URL, with the quota keys' shared hash tag on."""
    if redis_url.startswith(("redis+cluster://", "rediss+cluster://")):
        keys.use_hash_tags(True)
        cluster = redis.RedisCluster.from_url(redis_url.replace("+cluster://", "://", 1),
                                              socket_timeout=socket_timeout, socket_connect_timeout=5)
        return cluster  # type: ignore[return-value]  # the commands used here are both clients'
    return redis.Redis.from_url(redis_url, socket_timeout=socket_timeout, socket_connect_timeout=5)


class CallStore:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._keep_pending = client.register_script(_KEEP_PENDING)

    def answered(self, req: ExecuteRequest) -> bool:
        """Whether the call's result is stored already."""
        return bool(self.client.exists(req.result_key))

    def store(self, req: ExecuteRequest, result: SandboxResult) -> None:
        self.client.set(req.result_key, result.model_dump_json(), nx=True, ex=RESULT_TTL_S)

    def keep_pending(self, req: ExecuteRequest, ttl_s: float) -> None:
        """Keep the request's pending marker alive for at least `ttl_s` more (never shortened)."""
        self.keep_marker(req.pending_key, ttl_s)

    def keep_marker(self, pending_key: str | None, ttl_s: float) -> None:
        if pending_key:
            self._keep_pending(keys=[pending_key], args=[int(ttl_s * 1000)])
