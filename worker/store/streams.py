"""A tenant's open event streams, counted across every API process in one zset (`keys.tenant_streams`)
whose scores are lease ends: a stream of a dead process lapses. On the API's asyncio client."""

from __future__ import annotations

from redis import asyncio as aioredis

from . import keys
from .scripts import lua

_OPEN_STREAM = lua(__file__, "open_stream.lua")


class StreamSlots:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def open(self, tenant: str, stream_id: str, now: float, until: float, limit: int) -> bool:
        """Take a slot until `until` unless `limit` unlapsed ones are held already (False: none taken)."""
        return bool(await self.client.eval(_OPEN_STREAM, 1, keys.tenant_streams(tenant), now, until, limit,
                                           stream_id))

    async def renew(self, tenant: str, stream_id: str, until: float) -> None:
        await self.client.zadd(keys.tenant_streams(tenant), {stream_id: until}, xx=True)

    async def close(self, tenant: str, stream_id: str) -> None:
        await self.client.zrem(keys.tenant_streams(tenant), stream_id)
