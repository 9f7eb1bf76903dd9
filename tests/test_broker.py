"""worker/tasks/broker.py: kombu's Redis transport keeping one synchronous client per connection pool."""

from __future__ import annotations

import json

import pytest
import redis
from celery import Celery

from tests.fixtures_redis_cluster import MASTER, SentinelBroker
from worker.tasks import broker


def test_the_transport_is_ours_for_redis_and_sentinel_urls() -> None:
    assert broker.transport_for("redis://127.0.0.1:6379/0") == broker.TRANSPORT
    assert broker.transport_for("rediss://h:6380/0") == broker.TRANSPORT
    assert broker.transport_for("sentinel://h:26379;sentinel://h:26380") == broker.SENTINEL_TRANSPORT
    assert broker.transport_for("redis+socket:///tmp/redis.sock") is None


def test_a_channel_keeps_one_client_per_pool_and_messages_still_flow(redis_url: str) -> None:
    app = Celery("t", broker=redis_url)
    app.conf.broker_transport = broker.transport_for(redis_url)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, broker.Channel)
        kept = channel._create_client()
        assert channel._create_client() is kept
        assert channel._create_client(asynchronous=True) is not kept  # the event loop's client is kombu's

        queue = conn.SimpleQueue("reactq.test.broker")
        for i in range(3):
            queue.put({"n": i})
        got = []
        for _ in range(3):
            message = queue.get(timeout=5)
            got.append(message.payload["n"])
            message.ack()  # acks go through the kept client
        assert got == [0, 1, 2]
        queue.close()

        channel._disconnect_pools()  # what kombu does on a reconnect: a new pool gets a new client
        assert channel._create_client() is not kept
        assert channel._create_client().ping()


def test_closing_after_the_connection_was_dropped_is_a_connection_error(redis_url: str) -> None:
    """A worker whose Redis went away closes its channel while kombu has already dropped the connection's
    details and its pool; restoring the unacked messages then needs a client that cannot be made. kombu
    failed there with an AttributeError, which Celery treats as fatal (the worker exited on a Redis
    restart); a connection error is what kombu's close path ignores."""
    app = Celery("t", broker=redis_url)
    app.conf.broker_transport = broker.transport_for(redis_url)
    conn = app.connection_for_write()
    channel = conn.default_channel
    queue = conn.SimpleQueue("reactq.test.broker-dropped")
    queue.put({"n": 1})
    assert queue.get(timeout=5).payload == {"n": 1}  # taken, not acked: the channel must restore it on close
    channel._disconnect_pools()
    conn.transport.client = None  # what kombu's connection release does to the transport
    with pytest.raises(redis.exceptions.ConnectionError):
        channel._create_client()
    conn.maybe_close_channel(channel)  # raised before: AttributeError ('NoneType' ... 'hostname')
    assert channel.closed


def test_a_sentinel_channel_closing_after_its_connection_was_dropped_is_a_connection_error(
        sentinel_broker: SentinelBroker) -> None:
    """The same close as above on a Sentinel-managed broker, as a failover leaves it: the acks of tasks that
    ended meanwhile failed with kombu's AttributeError and the worker exited (test_broker_apart's failover
    test, once in a fresh CI run)."""
    app = Celery("t", broker=sentinel_broker.url)
    app.conf.broker_transport = broker.transport_for(sentinel_broker.url)
    app.conf.broker_transport_options = {"master_name": MASTER}
    conn = app.connection_for_write()
    channel = conn.default_channel
    assert isinstance(channel, broker.SentinelChannel)
    queue = conn.SimpleQueue("reactq.test.sentinel-dropped")
    queue.put({"n": 1})
    message = queue.get(timeout=5)
    assert message.payload == {"n": 1}  # taken through the Sentinel's primary, not acked
    channel._disconnect_pools()
    conn.transport.client = None
    with pytest.raises(redis.exceptions.ConnectionError):
        message.ack()  # raised AttributeError ('NoneType' ... 'hostname')
    conn.maybe_close_channel(channel)
    assert channel.closed


def test_a_submissions_first_steps_go_out_together(redis_url: str) -> None:
    """`sending_together` (what `reactq batch` and POST /v1/batches submit with): the messages wait in
    one pipeline and all arrive, with their priority and argsrepr, when the block ends."""
    from worker.names import PRIORITY_STEPS, STEPS_QUEUE, queue_lists, step_reprs
    from worker.tasks.steps import sending_together

    client = redis.Redis.from_url(redis_url)
    client.delete(*queue_lists(STEPS_QUEUE))
    app = Celery("t", broker=redis_url)
    app.conf.broker_transport = broker.transport_for(redis_url)
    app.conf.broker_transport_options = {"priority_steps": PRIORITY_STEPS}
    run_ids = [f"{i:032x}" for i in range(3)]

    def queued() -> list[bytes]:
        return [m for key in queue_lists(STEPS_QUEUE) for m in client.lrange(key, 0, -1)]

    with sending_together(app) as send:
        for run_id in run_ids:
            send(run_id, 0, priority=4)
        assert queued() == []  # buffered until the block ends
    assert client.llen(queue_lists(STEPS_QUEUE)[4]) == 3
    sent = [json.loads(m)["headers"]["argsrepr"] for m in queued()]
    assert sorted(sent) == sorted(step_reprs(run_id, 0)["argsrepr"] for run_id in run_ids)
    client.delete(*queue_lists(STEPS_QUEUE))
