"""Step messages written without Celery. A command that only sends steps (`reactq batch`, `reactq ask` and the
others) publishes them with `StepPublisher`: importing Celery and kombu and making the app is ~0.085 s of the
~0.35 s of CPU such a command costs (BENCHMARKS.md). A step's commit writes its next step's message from
`step_message` (worker/tasks/steps.py, `step_commands`): ~19 us a message, where building it through Celery
and kombu's publish path cost ~133. This module imports neither.

A message is the one `send_step` (worker/tasks/steps.py) publishes through kombu's Redis transport: Celery's
protocol 2, the JSON body base64-encoded, LPUSHed on the list of the steps queue for its priority.
tests/test_publish.py holds the two side by side, field by field, so that a Celery or kombu upgrade that
changes the message fails there first. Only brokers kombu's Redis transports serve (redis://, rediss://,
sentinel://) are published to this way (`StepPublisher.usable`); any other keeps Celery.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import socket
import uuid
from bisect import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..names import PRIORITY_STEPS, STEP_TASK, STEPS_QUEUE, queue_lists, step_reprs

SCHEMES = ("redis://", "rediss://")  # worker.tasks.broker's transport; other URLs keep kombu's own
BROKERS = (*SCHEMES, "sentinel://")  # kombu's Redis and Sentinel transports: the same lists, the same messages
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}  # a task with no workflow


def steps_list(priority: int) -> str:
    """The Redis list of the steps queue that holds messages of `priority`: kombu clamps it to 0..9 and files
    it under the highest of the queue's priority steps not above it (`_get_message_priority`, `_q_for_pri`)."""
    return queue_lists(STEPS_QUEUE)[bisect(PRIORITY_STEPS, max(min(priority, 9), 0)) - 1]


@functools.cache
def sender_names(pid: int) -> tuple[str, str]:
    """(origin, reply_to) of the messages this process sends: Celery's name for a process that is no worker, and
    a result queue of its own (results are never asked for). By pid: a forked process names itself anew."""
    return f"gen{pid}@{socket.gethostname()}", str(uuid.uuid4())


def step_message(run_id: str, index: int, priority: int | None) -> tuple[str, str]:
    """(list, payload): what `send_step(run_id, index, priority)` LPUSHes, with fresh ids."""
    task_id, reprs = str(uuid.uuid4()), step_reprs(run_id, index)
    origin, reply_to = sender_names(os.getpid())
    body = json.dumps([[run_id, index], {}, EMBED]).encode()
    headers: dict[str, Any] = {
        "lang": "py", "task": STEP_TASK, "id": task_id, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
        "parent_id": None, **reprs, "origin": origin, "ignore_result": True, "replaced_task_nesting": 0,
        "stamped_headers": None, "stamps": {},
    }
    properties: dict[str, Any] = {
        "correlation_id": task_id, "reply_to": reply_to, **reprs, "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": STEPS_QUEUE}, "priority": priority or 0,
        "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
    }
    message = {"body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
               "content-type": "application/json", "headers": headers, "properties": properties}
    return steps_list(priority or 0), json.dumps(message)


class StepPublisher:
    """`send_step` and `sending_together` for a process that sends steps and runs none, on the broker's Redis
    client (Runtime.broker_redis). No countdown: the commands never delay a step."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    @staticmethod
    def usable(broker_url: str) -> bool:
        return broker_url.startswith(BROKERS)

    def send_step(self, run_id: str, index: int, priority: int | None = None) -> None:
        self.broker.lpush(*step_message(run_id, index, priority))

    @contextmanager
    def sending_together(self) -> Iterator[Callable[..., None]]:
        """A send_step whose messages go out in one round trip as the block ends; leaving it with an exception
        sends none (their runs are recorded, and the reaper re-kicks them: `lost_message`)."""
        pipe = self.broker.pipeline(transaction=False)

        def send(run_id: str, index: int, priority: int | None = None) -> None:
            pipe.lpush(*step_message(run_id, index, priority))

        yield send
        pipe.execute()
