"""kombu's Redis transport, keeping one redis-py client per connection pool for its synchronous commands.

kombu builds a new `redis.Redis` for every message it reserves and every ack (`Channel.conn_or_acquire`),
and redis-py's constructor copies its table of response callbacks each time: at 1,000 runs in flight
that was an eighth of a step worker's CPU (BENCHMARKS.md, case (c)). A client is thread-safe (each
command borrows a connection from the pool), so one per pool does the same work. Only the synchronous
client is kept; the event loop's client (BRPOP) is kombu's own.

It can also hand back a message instead of sending it (`capturing`): the Redis commands kombu would
run to publish it, for a caller that writes them itself in a transaction of its own (a step's commit
enqueues the next step: worker/tasks/steps.py, `step_commands`).

A Sentinel-managed broker (sentinel:// URLs) keeps kombu's Sentinel transport with one change, shared with
the transport above: a channel closing after its connection was dropped raises a connection error
(`refuse_when_closed`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


_captured = threading.local()


@contextmanager
def capturing() -> Iterator[list[tuple[Any, ...]]]:
    """Inside the block, a producer's batch (`Producer.batch()`) on this thread sends nothing: the list
    receives the Redis commands (name, *args) its messages would have been published with."""
    commands: list[tuple[Any, ...]] = []
    _captured.commands = commands
    try:
        yield commands
    finally:
        _captured.commands = None


class CapturedPublishes:
    """A publish batch that keeps the final Redis commands kombu routes a message to (the LPUSH on the
    queue's list for the message's priority) instead of running them; kombu's PublishBatch protocol."""

    def __init__(self, channel: Any, commands: list[tuple[Any, ...]]) -> None:
        self.channel = channel
        self.commands = commands

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name.upper(), *args))

    def flush(self) -> None:
        """Nothing to send: the caller writes the commands."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        pass


class Channel(kombu_redis.Channel):
    _kept_client: Any = None

    def create_publish_batch(self, max_size: int) -> Any:
        commands = getattr(_captured, "commands", None)
        if commands is None:
            return super().create_publish_batch(max_size)
        return CapturedPublishes(self, commands)

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
