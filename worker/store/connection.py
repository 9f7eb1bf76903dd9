"""Redis connections: the patient client workers use, and the impatient check a person waits on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterPipeline, PipelineStrategy, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..config import cluster_seed_url, is_cluster_url
from ..errors import StoreUnavailable
from . import keys

T = TypeVar("T")

RedisError = redis.exceptions.RedisError  # what any store call raises when Redis fails (the API maps it to 503)
Client = redis.Redis  # the synchronous client the store classes are built on


def _retry() -> Retry:
    # ~30 s of retries: long enough to ride out a Redis restart or a cluster failover
    return Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=20,
                 supported_errors=(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError))


CLUSTER_PATIENCE_S = 30.0  # about what the single client's retries ride out: a failover takes a few seconds


def _patiently(call: Callable[[], T], again: Callable[[], None] = lambda: None) -> T:
    """`call`, again after a growing pause while it fails with a cluster error, for up to CLUSTER_PATIENCE_S."""
    deadline, pause = time.monotonic() + CLUSTER_PATIENCE_S, 0.05
    while True:
        try:
            return call()
        except RedisCluster.ERRORS_ALLOW_RETRY:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 2.0)
            again()


class PatientPipeline(ClusterPipeline):
    """A cluster pipeline that rides out a failover (see PatientCluster); a command that had run before the
    error runs again, as after a single client's retry of a lost reply."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        strategy = self._execution_strategy
        if not isinstance(strategy, PipelineStrategy):  # a WATCH/MULTI transaction: its caller starts again
            return super().execute(raise_on_error)
        queued = list(strategy.command_queue)

        def requeue() -> None:
            strategy.command_queue = list(queued)

        return _patiently(lambda: ClusterPipeline.execute(self, raise_on_error), requeue)


class PatientCluster(RedisCluster):
    """A Redis Cluster client that rides out a failover. redis-py retries a command's or a pipeline's cluster
    errors at once, some twenty times in a few milliseconds, while a replica needs seconds to take over its
    primary's slots; this one tries again after a growing pause, for up to CLUSTER_PATIENCE_S."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return _patiently(lambda: RedisCluster.execute_command(self, *args, **kwargs))

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe = super().pipeline(transaction, shard_hint)
        pipe.__class__ = PatientPipeline
        return pipe


def connect_cluster(url: str, max_connections: int = 64) -> redis.Redis:
    """A Redis Cluster client from one seed node (redis+cluster://...), and this process's keys tagged by
    run, batch, tenant and model (keys.use_hash_tags) so that each lives on one shard."""
    keys.use_hash_tags(True)
    client = PatientCluster.from_url(
        cluster_seed_url(url), max_connections=max_connections, socket_connect_timeout=5, socket_timeout=30,
        socket_keepalive=True, retry=_retry(), cluster_error_retry_attempts=10,
    )
    return client  # type: ignore[return-value]  # the store uses the commands both clients have


def connect(url: str, max_connections: int = 64) -> redis.Redis:
    """A client whose pool holds `max_connections` (blocking, not raising, when all are busy) and which
    retries through a Redis restart; a Redis Cluster's for a redis+cluster:// URL."""
    if is_cluster_url(url):
        return connect_cluster(url, max_connections)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=30, health_check_interval=30,
        socket_connect_timeout=5, socket_keepalive=True,
        retry=_retry(),
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
    first = urlsplit(url.split(";")[0])  # the Redis user of the master, as kombu reads it (ACL users)
    sentinel = Sentinel(nodes, socket_timeout=5, sentinel_kwargs={"socket_timeout": 5})
    return sentinel.master_for(sentinel_master or "", username=first.username, password=first.password,
                               socket_timeout=30,
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
    client: redis.Redis | RedisCluster | None = None
    options = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s, "retry": Retry(NoBackoff(), 0)}
    try:
        client = (RedisCluster.from_url(cluster_seed_url(url), **options) if is_cluster_url(url)
                  else redis.Redis.from_url(url, retry_on_error=[], **options))
        client.ping()
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        raise StoreUnavailable(url, exc) from None
    finally:
        if client is not None:
            client.close()


def mget(client: redis.Redis, names: list[str]) -> list[bytes | None]:
    """GET of each key: one MGET on a single Redis; on a cluster, one per shard (its keys are spread)."""
    if not names:
        return []
    if isinstance(client, RedisCluster):
        return client.mget_nonatomic(names)
    return client.mget(names)


def text_fields(raw: dict[bytes, bytes]) -> dict[str, str]:
    """A hash as Redis returns it (bytes), as text."""
    return {k.decode(): v.decode() for k, v in raw.items()}
