"""What the HTTP API reads on its event loop, with an asyncio client: API key and tenant records (every
request), a run's record and its event stream (server-sent events), and a ping for /healthz."""

from __future__ import annotations

from typing import Any

from redis import asyncio as aioredis

from ..config import cluster_seed_url, is_cluster_url
from . import keys
from .connection import text_fields


def connect_async(url: str, max_connections: int) -> aioredis.Redis:
    """An asyncio client whose pool waits for a free connection instead of raising when all are busy; a Redis
    Cluster's for a redis+cluster:// URL, with the keys' hash tags on (as connection.connect_cluster does)."""
    if is_cluster_url(url):
        keys.use_hash_tags(True)
        cluster = aioredis.RedisCluster.from_url(cluster_seed_url(url), max_connections=max_connections)
        return cluster  # type: ignore[return-value]  # the reads below use commands both clients have
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=30)
    return aioredis.Redis(connection_pool=pool)


class AsyncReads:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def ping(self) -> None:
        await self.client.ping()

    async def api_key(self, key_id: str) -> dict[str, str]:
        """An API key's record (empty: unknown)."""
        return text_fields(await self.client.hgetall(keys.api_key(key_id)))

    async def tenant(self, name: str) -> dict[str, str]:
        """A tenant's record (empty: none, which a REACTQ_TENANTS tenant may have)."""
        return text_fields(await self.client.hgetall(keys.tenant(name)))

    async def run(self, run_id: str) -> bytes | None:
        return await self.client.get(keys.run(run_id))  # type: ignore[no-any-return]

    async def compacted_events(self, run_id: str) -> bytes | None:
        """A finished run's events as one JSON string (None until its stream was compacted)."""
        return await self.client.get(keys.events_compacted(run_id))  # type: ignore[no-any-return]

    async def step(self, run_id: str, index: int) -> bytes | None:
        return await self.client.lindex(keys.steps(run_id), index)  # type: ignore[no-any-return]

    async def events_after(self, run_id: str, last: str, count: int, block_ms: int) -> list[tuple[str, str, str]]:
        """Up to `count` events after entry `last` as (entry id, type, data), waiting up to `block_ms` for
        the first (empty: none came)."""
        result: Any = await self.client.xread({keys.events(run_id): last}, count=count, block=block_ms)
        return [(entry_id.decode(), fields[b"type"].decode(), fields[b"data"].decode())
                for _stream, entries in result or [] for entry_id, fields in entries]
