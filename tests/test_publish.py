"""worker/tasks/publish.py: the step message a command publishes without Celery is the one Celery publishes, and
a command that sends steps imports no Celery. The workers running what it sends: tests/test_batch_tenants.py,
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

from worker.names import PRIORITY_STEPS, STEP_TASK, STEPS_QUEUE, queue_lists
from worker.tasks import broker
from worker.tasks.publish import StepPublisher, step_message

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
    [(key, payload)] = [(k, m) for k in queue_lists(STEPS_QUEUE) for m in client.lrange(k, 0, -1)]
    client.delete(*queue_lists(STEPS_QUEUE))
    return key, payload


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
    publisher = StepPublisher(client)
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
    assert StepPublisher.usable("redis://127.0.0.1:6379/0")
    assert StepPublisher.usable("rediss://h:6380/0")
    assert StepPublisher.usable("sentinel://h:26379;sentinel://h:26380")
    assert not StepPublisher.usable("redis+socket:///tmp/redis.sock")
    assert not StepPublisher.usable("amqp://guest@h//")


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
    [message] = [m for k in queue_lists(STEPS_QUEUE) for m in client.lrange(k, 0, -1)]
    assert json.loads(base64.b64decode(json.loads(message)["body"]))[0] == [run_id, 0]
    client.delete(*queue_lists(STEPS_QUEUE))
