"""kombu's Redis transport, keeping one redis-py client per connection pool for its synchronous commands.

kombu builds a new `redis.Redis` for every message it reserves and every ack (`Channel.conn_or_acquire`),
and redis-py's constructor copies its table of response callbacks each time: at 1,000 runs in flight
that was an eighth of a step worker's CPU (BENCHMARKS.md, case (c)). A client is thread-safe (each
command borrows a connection from the pool), so one per pool does the same work. Only the synchronous
client is kept; the event loop's client (BRPOP) is kombu's own.

A Sentinel-managed broker (sentinel:// URLs) keeps kombu's Sentinel transport with one change, shared with
the transport above: a channel closing after its connection was dropped raises a connection error
(`refuse_when_closed`)."""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from .publish import SCHEMES  # other URLs (unix sockets, say) keep kombu's transport

TRANSPORT = "worker.tasks.broker:Transport"
SENTINEL_TRANSPORT = "worker.tasks.broker:SentinelTransport"


def refuse_when_closed(channel: kombu_redis.Channel) -> None:
    """Closing after kombu dropped the connection's details (Redis went away, or a Sentinel failed it over)
    while acks from the pool's threads still come in: a new pool cannot be made. kombu would fail with an
    AttributeError, which Celery takes as fatal and the worker exits; a connection error is what the ack
    and close paths log and go past. The messages this channel held unacked stay in Redis's `unacked` hash:
    the broker restores them after its visibility timeout, and the reaper re-kicks their runs long before
    (worker/runtime/reaper.py, `lost_message`)."""
    if channel._pool is None and getattr(channel.connection, "client", None) is None:
        raise redis.exceptions.ConnectionError("the broker connection is closed")


class Channel(kombu_redis.Channel):
    _kept_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        refuse_when_closed(self)
        kept = self._kept_client
        if kept is None or kept.connection_pool is not self.pool:  # a reconnect makes a new pool
            kept = self._kept_client = super()._create_client()
        return kept


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(kombu_redis.SentinelChannel):
    def _create_client(self, asynchronous: bool = False) -> Any:
        if not asynchronous:
            refuse_when_closed(self)
        return super()._create_client(asynchronous=asynchronous)


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def transport_for(url: str) -> str | None:
    """The transport to name in Celery's `broker_transport` for this broker URL (None: kombu's choice)."""
    if url.startswith("sentinel://"):
        return SENTINEL_TRANSPORT
    return TRANSPORT if url.startswith(SCHEMES) else None
