"""Redis connections: the patient client workers use, and the impatient check a person waits on."""

from __future__ import annotations

from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..errors import StoreUnavailable

RedisError = redis.exceptions.RedisError  # what any store call raises when Redis fails (the API maps it to 503)
Client = redis.Redis  # the synchronous client the store classes are built on


def connect(url: str, max_connections: int = 64) -> redis.Redis:
    """A client whose pool holds `max_connections` (blocking, not raising, when all are busy) and which
    retries through a Redis restart."""
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=30, health_check_interval=30,
        socket_connect_timeout=5, socket_keepalive=True,
        # ~30 s of retries: long enough to ride out a Redis restart
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=20,
                    supported_errors=(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )
    return redis.Redis(connection_pool=pool)


def connect_broker(url: str, sentinel_master: str | None, max_connections: int = 64) -> redis.Redis:
    """A client of the Celery broker (its lists, kombu's unacked hash): `url` as connect() takes it, or
    sentinel://HOST:PORT[;sentinel://HOST:PORT...] (kombu's form), whose master `sentinel_master` it follows
    through a failover."""
    if not url.startswith("sentinel://"):
        return connect(url, max_connections)
    nodes = []
    for part in url.split(";"):
        address = urlsplit(part.strip())
        nodes.append((address.hostname or "127.0.0.1", address.port or 26379))
    password = urlsplit(url.split(";")[0]).password
    sentinel = Sentinel(nodes, socket_timeout=5, sentinel_kwargs={"socket_timeout": 5})
    return sentinel.master_for(sentinel_master or "", password=password, socket_timeout=30,
                               retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=20),
                               retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError])


def ping(client: redis.Redis, url: str) -> None:
    """Patient: rides the client's retries (a worker starting while Redis restarts)."""
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise StoreUnavailable(url, exc) from None


QUICK_TIMEOUT_S = 2.0


def ping_quickly(url: str, timeout_s: float = QUICK_TIMEOUT_S) -> None:
    """Impatient: one attempt with short timeouts, for a person waiting at a prompt.

    The store's own client retries for ~30 s to ride out a restart, which is right for a daemon and
    wrong for `reactq status`: an unreachable Redis must be reported within seconds."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                                  retry=Retry(NoBackoff(), 0), retry_on_error=[])
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise StoreUnavailable(url, exc) from None
    finally:
        client.close()


def text_fields(raw: dict[bytes, bytes]) -> dict[str, str]:
    """A hash as Redis returns it (bytes), as text."""
    return {k.decode(): v.decode() for k, v in raw.items()}
