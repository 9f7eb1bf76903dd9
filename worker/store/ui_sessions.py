"""The operator UI's server-side sessions: one Redis hash per sign-in, named by the SHA-256 of the
cookie's random token and expiring with it (worker/api/ui/session.py decides what goes in it)."""

from __future__ import annotations

from redis import asyncio as aioredis

from . import keys
from .connection import text_fields


class UiSessions:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def create(self, digest: str, fields: dict[str, str], ttl_s: int) -> None:
        pipe = self.client.pipeline()
        pipe.hset(keys.ui_session(digest), mapping=fields)  # type: ignore[arg-type]
        pipe.expire(keys.ui_session(digest), ttl_s)
        await pipe.execute()

    async def get(self, digest: str) -> dict[str, str]:
        """A session's fields (empty: none, or expired)."""
        return text_fields(await self.client.hgetall(keys.ui_session(digest)))

    async def delete(self, digest: str) -> None:
        await self.client.delete(keys.ui_session(digest))
