"""worker/tasks/publish.py: the step and sandbox messages written without Celery are the ones Celery publishes, a
command that sends steps imports no Celery, and a worker's sandbox side sends its continuations and woken calls
through the publisher. The workers running what it sends: tests/test_batch_tenants.py,
tests/test_fairness.py and every other test driving `reactq ask` or `reactq batch` (tests/fixtures_cluster.py)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from celery import Celery

from tools_sandbox.edges import sandbox_worker
from worker.names import PRIORITY_STEPS, SANDBOX_QUEUE, SANDBOX_TASK, STEP_TASK, STEPS_QUEUE, queue_lists
from worker.tasks import broker
from worker.tasks.publish import REPR_MAX, Publisher, step_message, task_message

ROOT = Path(__file__).resolve().parent.parent
FRESH = {"headers": ("id", "root_id", "origin"), "properties": ("correlation_id", "delivery_tag", "reply_to")}


def without_fresh_fields(payload: str | bytes) -> dict:
    """The message with its per-message ids and per-process names taken out, the body decoded."""
    message = json.loads(payload)
    for part, names in FRESH.items():
        for name in names:
            message[part].pop(name)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def take_the_one_message(client: redis.Redis, queue: str) -> tuple[str, bytes]:
    """(list, payload) of the one message on `queue`'s lists, which are then emptied."""
    [(key, payload)] = [(k, m) for k in queue_lists(queue) for m in client.lrange(k, 0, -1)]
    client.delete(*queue_lists(queue))
    return key, payload


def celery_app(redis_url: str) -> Celery:
    app = Celery("t", broker=redis_url)
    app.conf.broker_transport = broker.transport_for(redis_url)
    app.conf.broker_transport_options = {"priority_steps": PRIORITY_STEPS}
    return app


def published_by_celery(redis_url: str, run_id: str, index: int, priority: int | None) -> tuple[str, bytes]:
    """(list, payload) of the one message Celery's own `send_step` left in Redis."""
    from worker.tasks.steps import send_step

    client = redis.Redis.from_url(redis_url)
    client.delete(*queue_lists(STEPS_QUEUE))
    with celery_app(redis_url).producer_or_acquire() as producer:
        send_step(run_id, index, priority, producer=producer)
    return take_the_one_message(client, STEPS_QUEUE)


@pytest.mark.parametrize("priority", [None, 0, 3, 9, 12, -1])
def test_the_message_is_the_one_celery_publishes_field_by_field(redis_url: str, priority: int | None) -> None:
    run_id = "ab" * 16
    celery_list, celery_payload = published_by_celery(redis_url, run_id, 4, priority)
    ours_list, ours_payload = step_message(run_id, 4, priority)
    assert ours_list == celery_list
    assert without_fresh_fields(ours_payload) == without_fresh_fields(celery_payload)
    ours = json.loads(ours_payload)
    assert ours["headers"]["id"] == ours["headers"]["root_id"] == ours["properties"]["correlation_id"]
    assert ours["headers"]["task"] == STEP_TASK
    assert ours["headers"]["origin"] == f"gen{os.getpid()}@{socket.gethostname()}"


def sent_by_celery(redis_url: str, task: str, args: list, queue: str, priority: int | None = None) -> tuple[str, bytes]:
    """(list, payload) of the one message Celery's `send_task` left in Redis, as a sandbox worker sent it."""
    client = redis.Redis.from_url(redis_url)
    client.delete(*queue_lists(queue))
    celery_app(redis_url).send_task(task, args=args, queue=queue, priority=priority, declare=[])
    return take_the_one_message(client, queue)


CALL = {"code": "print('h\u00e9llo')\nprint(6 * 7)\n", "tier": "standard", "tenant": "t1", "result_key": "k:1",
        "continue_task": STEP_TASK, "continue_args": ["ab" * 16, 3], "continue_queue": STEPS_QUEUE,
        "continue_priority": 4, "deadline_at": 1.5, "queued_at": None, "waits": 0, "session": [[1, True]]}


@pytest.mark.parametrize("code", ["print(6 * 7)", "x = 'a\nb'  # \u00e9\n" * 200])
def test_a_sandbox_call_is_the_message_celerys_send_task_publishes_but_for_its_argsrepr(redis_url: str,
                                                                                        code: str) -> None:
    """The argsrepr is Python's repr cut at Celery's 1,024 characters, not saferepr's escaping: nothing reads it."""
    call = {**CALL, "code": code}
    celery_list, celery_payload = sent_by_celery(redis_url, SANDBOX_TASK, [call], SANDBOX_QUEUE)
    ours_list, ours_payload = task_message(SANDBOX_TASK, [call], SANDBOX_QUEUE)
    celery, ours = without_fresh_fields(celery_payload), without_fresh_fields(ours_payload)
    assert ours_list == celery_list == SANDBOX_QUEUE
    argsrepr = ours["headers"].pop("argsrepr")
    assert celery["headers"].pop("argsrepr").startswith("[{'code': ")
    assert ours == celery
    whole = repr([call])
    assert argsrepr == (whole if len(whole) <= REPR_MAX else whole[:REPR_MAX - 3] + "...")
    assert len(argsrepr) <= REPR_MAX


def test_a_continuation_is_the_message_of_send_step_on_its_priority(redis_url: str) -> None:
    """What a sandbox worker sends to continue a run is the step's own message (the reaper reads its argsrepr)."""
    publisher = Publisher(redis.Redis.from_url(redis_url))
    publisher.broker.delete(*queue_lists(STEPS_QUEUE))
    publisher.send_task(STEP_TASK, ["ab" * 16, 3], STEPS_QUEUE, 4)
    key, payload = take_the_one_message(publisher.broker, STEPS_QUEUE)
    celery_list, celery_payload = published_by_celery(redis_url, "ab" * 16, 3, 4)
    assert key == celery_list
    assert without_fresh_fields(payload) == without_fresh_fields(celery_payload)


def test_a_worker_s_sandbox_side_publishes_through_the_publisher(redis_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """worker_setup installs the publisher for the sandbox worker of a worker process on a Redis broker; its
    continuations and woken calls then reach the broker without Celery (no app is given), as do the steps a
    worker sends after their commit or re-kicks."""
    from worker.config import get_settings
    from worker.runtime import context
    from worker.tasks import steps, worker_setup

    monkeypatch.setenv("REACTQ_REDIS_URL", redis_url)
    monkeypatch.setattr(context, "_runtime", None)
    get_settings.cache_clear()
    steps.worker_publisher.cache_clear()
    try:
        worker_setup._publish_sandbox_messages()
        sandbox_worker._publish(None, STEP_TASK, ["cd" * 16, 1], STEPS_QUEUE, 2)
        sandbox_worker._publish(None, SANDBOX_TASK, [CALL], SANDBOX_QUEUE)
        steps.send_next_step("ef" * 16, 5)  # outside a step task: priority 0, as send_step's
    finally:
        sandbox_worker.publish_with(None)
        steps.worker_publisher.cache_clear()
        get_settings.cache_clear()
    client = redis.Redis.from_url(redis_url)
    [step] = client.lrange(f"{STEPS_QUEUE}\x06\x162", 0, -1)
    [call] = client.lrange(SANDBOX_QUEUE, 0, -1)
    [next_step] = client.lrange(STEPS_QUEUE, 0, -1)
    client.delete(*queue_lists(STEPS_QUEUE), *queue_lists(SANDBOX_QUEUE))
    assert without_fresh_fields(next_step)["body"][0] == ["ef" * 16, 5]
    assert without_fresh_fields(step)["body"][0] == ["cd" * 16, 1]
    assert without_fresh_fields(call)["body"][0] == [CALL]


def test_a_commit_writes_the_next_steps_message_on_the_running_steps_priority() -> None:
    """`step_commands`: the one LPUSH a step's commit writes; outside a step task the default priority is 0."""
    from worker.tasks.steps import step_commands

    [(command, key, payload)] = step_commands("cd" * 16, 2, priority=5)
    assert (command, key) == ("LPUSH", f"{STEPS_QUEUE}\x06\x165")
    assert json.loads(base64.b64decode(json.loads(payload)["body"]))[0] == ["cd" * 16, 2]
    [(_, key, payload)] = step_commands("cd" * 16, 2)
    assert key == STEPS_QUEUE and json.loads(payload)["properties"]["priority"] == 0


def test_each_message_has_its_own_ids() -> None:
    first, second = (json.loads(step_message("r", 0, None)[1]) for _ in range(2))
    assert first["headers"]["id"] != second["headers"]["id"]
    assert first["properties"]["delivery_tag"] != second["properties"]["delivery_tag"]


def test_sending_together_sends_as_the_block_ends_and_nothing_when_it_fails(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(*queue_lists(STEPS_QUEUE))
    publisher = Publisher(client)
    with publisher.sending_together() as send:
        send("cd" * 16, 0, priority=2)
        send("ef" * 16, 0)
        assert sum(client.llen(k) for k in queue_lists(STEPS_QUEUE)) == 0
    assert client.llen(f"{STEPS_QUEUE}\x06\x162") == 1 and client.llen(STEPS_QUEUE) == 1
    with pytest.raises(RuntimeError), publisher.sending_together() as send:
        send("ab" * 16, 0)
        raise RuntimeError("the submission failed")
    assert sum(client.llen(k) for k in queue_lists(STEPS_QUEUE)) == 2
    publisher.send_step("ab" * 16, 1)
    assert client.llen(STEPS_QUEUE) == 2
    assert json.loads(client.lindex(STEPS_QUEUE, 0))["headers"]["origin"] == f"gen{os.getpid()}@{socket.gethostname()}"
    client.delete(*queue_lists(STEPS_QUEUE))


def test_only_brokers_of_kombus_redis_transports_are_published_to_directly() -> None:
    assert Publisher.usable("redis://127.0.0.1:6379/0")
    assert Publisher.usable("rediss://h:6380/0")
    assert Publisher.usable("sentinel://h:26379;sentinel://h:26380")
    assert not Publisher.usable("redis+socket:///tmp/redis.sock")
    assert not Publisher.usable("amqp://guest@h//")


# `reactq ask` in its own interpreter: which frameworks it loaded, printed as it exits.
ASK = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(m for m in ("celery", "kombu") if m in sys.modules))))
sys.argv = ["reactq", "ask", "What is 6 * 7?", "--json"]
from worker.cli import main
main()
"""


def test_a_command_that_sends_a_step_imports_no_celery(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(*queue_lists(STEPS_QUEUE))
    env = {**os.environ, "REACTQ_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", ASK], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    *answer, loaded = done.stdout.strip().splitlines()
    assert json.loads(loaded) == []
    run_id = json.loads("\n".join(answer))["run_id"]
    _, message = take_the_one_message(client, STEPS_QUEUE)
    assert json.loads(base64.b64decode(json.loads(message)["body"]))[0] == [run_id, 0]
