"""Task messages written without Celery, on a broker kombu's Redis transports serve. A command that only sends
steps (`reactq batch`, `reactq ask` and the others) publishes them with `Publisher`: importing Celery and kombu
and making the app is ~0.085 s of the ~0.35 s of CPU such a command costs (BENCHMARKS.md). A step's commit
writes its next step's message from `step_message` (worker/tasks/steps.py, `step_commands`): ~19 us a message,
where building it through Celery and kombu's publish path cost ~133. A worker sends its sandbox calls, the steps
it sends after their commit and the reaper's re-kicks, and a sandbox worker its continuations and the calls it
wakes, through a `Publisher` too (worker/tasks/steps.py, worker_setup.py). This module imports neither Celery
nor kombu.

A message is the one Celery's `apply_async`/`send_task` publishes through kombu's Redis transport: protocol 2,
the JSON body base64-encoded, LPUSHed on the list of its queue for its priority. tests/test_publish.py holds
the two side by side, field by field, so that a Celery or kombu upgrade that changes the message fails there
first. One field differs by choice: a sandbox call's `argsrepr` is Python's repr of its arguments cut at 1,024
characters, where Celery's saferepr (~60 us a call) escapes strings its own way; nothing reads a sandbox
message's argsrepr (the reaper reads a step's, which is the same either way). Only brokers kombu's Redis
transports serve (redis://, rediss://, sentinel://) are published to this way (`Publisher.usable`); any other
keeps Celery.
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

from ..names import PRIORITY_STEPS, STEP_TASK, STEPS_QUEUE, queue_lists

SCHEMES = ("redis://", "rediss://")  # worker.tasks.broker's transport; other URLs keep kombu's own
BROKERS = (*SCHEMES, "sentinel://")  # kombu's Redis and Sentinel transports: the same lists, the same messages
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}  # a task with no workflow
REPR_MAX = 1024  # Celery's argsrepr_maxsize


def queue_list(queue: str, priority: int) -> str:
    """The Redis list of `queue` that holds messages of `priority`: kombu clamps it to 0..9 and files it under
    the highest of the queue's priority steps not above it (`_get_message_priority`, `_q_for_pri`)."""
    return queue_lists(queue)[bisect(PRIORITY_STEPS, max(min(priority, 9), 0)) - 1]


@functools.cache
def sender_names(pid: int) -> tuple[str, str]:
    """(origin, reply_to) of the messages this process sends: Celery's name for a process that is no worker, and
    a result queue of its own (results are never asked for). By pid: a forked process names itself anew."""
    return f"gen{pid}@{socket.gethostname()}", str(uuid.uuid4())


def task_message(task: str, args: list[Any], queue: str, priority: int | None = None, *,
                 step: bool = False) -> tuple[str, str]:
    """(list, payload): what Celery LPUSHes for `task` with positional `args` on `queue`, with fresh ids.
    `step`: as `send_step`'s `apply_async` writes it (the task ignores its result, and the reprs are
    given as options, so they are in the properties too); else as `send_task` does."""
    task_id = str(uuid.uuid4())
    origin, reply_to = sender_names(os.getpid())
    text = repr(args)
    reprs = {"argsrepr": text if len(text) <= REPR_MAX else text[:REPR_MAX - 3] + "...", "kwargsrepr": "{}"}
    body = json.dumps([args, {}, EMBED]).encode()
    headers: dict[str, Any] = {
        "lang": "py", "task": task, "id": task_id, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
        "parent_id": None, **reprs, "origin": origin, "ignore_result": True if step else None,
        "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
    }
    properties: dict[str, Any] = {
        "correlation_id": task_id, "reply_to": reply_to, **(reprs if step else {}), "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": queue}, "priority": priority or 0,
        "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
    }
    message = {"body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
               "content-type": "application/json", "headers": headers, "properties": properties}
    return queue_list(queue, priority or 0), json.dumps(message)


def step_message(run_id: str, index: int, priority: int | None) -> tuple[str, str]:
    """(list, payload): what `send_step(run_id, index, priority)` LPUSHes (its argsrepr is `step_reprs`'s)."""
    return task_message(STEP_TASK, [run_id, index], STEPS_QUEUE, priority, step=True)


class Publisher:
    """Sends task messages with no countdown on the broker's Redis client (Runtime.broker_redis): `send_step` and
    `sending_together` for the commands, `send_task` for the workers' sandbox calls and continuations. A
    message put off by a countdown keeps Celery (its ETA is the worker's to keep)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    @staticmethod
    def usable(broker_url: str) -> bool:
        return broker_url.startswith(BROKERS)

    @classmethod
    def of(cls, runtime: Any) -> Publisher | None:
        """The publisher of a process with this runtime, or None on a broker only Celery serves."""
        return cls(runtime.broker_redis) if cls.usable(runtime.settings.celery_broker_url) else None

    def send_step(self, run_id: str, index: int, priority: int | None = None) -> None:
        self.broker.lpush(*step_message(run_id, index, priority))

    def send_task(self, task: str, args: list[Any], queue: str, priority: int | None = None) -> None:
        self.broker.lpush(*task_message(task, args, queue, priority, step=task == STEP_TASK))

    @contextmanager
    def sending_together(self) -> Iterator[Callable[..., None]]:
        """A send_step whose messages go out in one round trip as the block ends; leaving it with an exception
        sends none (their runs are recorded, and the reaper re-kicks them: `lost_message`)."""
        pipe = self.broker.pipeline(transaction=False)

        def send(run_id: str, index: int, priority: int | None = None) -> None:
            pipe.lpush(*step_message(run_id, index, priority))

        yield send
        pipe.execute()
