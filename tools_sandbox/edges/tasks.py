"""The sandbox Celery task and the worker signals that start and stop this process's sandbox worker.

Bound with `shared_task`, so it joins whichever app the worker runs (worker/celery_app includes this module
and routes it to the `reactq.sandbox` queue). What a delivery does is edges/sandbox_worker.py's: this module
only adapts the message and Celery's retry. The sandbox worker is one per worker process: started when the
worker consumes `reactq.sandbox` (in each pool child, never in the forking parent; or, with a pool that runs
tasks in the worker's own process, once the worker is ready), else on first use; stopped at shutdown.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app, shared_task
from celery.signals import worker_process_init, worker_process_shutdown, worker_ready
from pydantic import ValidationError

from ..base.names import SANDBOX_QUEUE, SANDBOX_TASK
from ..base.request import ExecuteRequest
from . import health, sandbox_worker

log = logging.getLogger(__name__)

# A Redis that does not answer: the delivery is retried (Celery's retry, this many times, 2 s apart).
REDIS_RETRIES = 30
REDIS_RETRY_S = 2


@shared_task(name=SANDBOX_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=REDIS_RETRIES)
def execute(self: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One delivery of a sandbox call (sandbox_worker.SandboxWorker.handle); Celery's retry while Redis or the
    broker does not answer, then the call is left to its run's reaper, logged."""
    try:
        req = ExecuteRequest.model_validate(request)
    except ValidationError:
        log.error("sandbox request refused (invalid; the run's reaper will see it unanswered): %r",
                  request, exc_info=True)
        return {"result_key": None, "outcome": "invalid_request"}
    try:
        attempt = sandbox_worker.current().handle(self, req)
    except sandbox_worker.UNREACHABLE_SERVICES as exc:
        if self.request.retries >= REDIS_RETRIES:
            log.error("sandbox call %s: Redis unreachable after %d retries; its run's reaper re-sends it once "
                      "its pending marker expires", req.result_key, REDIS_RETRIES)
            raise
        raise self.retry(exc=exc, countdown=REDIS_RETRY_S, max_retries=REDIS_RETRIES) from exc
    return {"result_key": req.result_key, "outcome": attempt.outcome}


def _serves_sandbox(app: Any) -> bool:
    """Whether this worker consumes `reactq.sandbox` (named with -Q, or among the app's queues without -Q)."""
    try:
        return SANDBOX_QUEUE in app.amqp.queues.consume_from
    except AttributeError:
        return False


@worker_ready.connect
def _start_in_worker(sender: Any = None, **_: Any) -> None:
    """A worker whose pool runs tasks in its own process (threads, the reactq default) has no child to
    start the sandbox worker in: start it here once the worker is ready, and take sandbox tasks only while
    its backend can run them."""
    pool = str(getattr(getattr(sender, "controller", None), "pool_cls", "") or getattr(sender, "pool_cls", ""))
    app = getattr(sender, "app", None)
    if "prefork" in pool or app is None or not _serves_sandbox(app):
        return
    follow = hasattr(sender, "call_soon")
    if follow:
        health.on_change(lambda up: _consume(sender))
    _start(app)
    if follow:
        _consume(sender)


def _consume(consumer: Any) -> None:
    """Take sandbox tasks only while the backend can run them. The change runs in the consumer's own loop
    before it next fetches a message (as Celery's add_consumer/cancel_consumer control commands do), and
    follows the backend's state when it runs, so changes queued in any order end in the right one."""

    def follow() -> None:
        if sandbox_worker.current().service.up:
            consumer.add_task_queue(SANDBOX_QUEUE)
        elif consumer.task_consumer is not None and consumer.task_consumer.consuming_from(SANDBOX_QUEUE):
            consumer.cancel_task_queue(SANDBOX_QUEUE)

    consumer.call_soon(follow)


@worker_process_init.connect
def _start_in_child(**_: Any) -> None:
    """A pool child of a worker that takes sandbox tasks (never the forking parent)."""
    if _serves_sandbox(current_app):
        _start(current_app)


def _start(app: Any) -> None:
    worker = sandbox_worker.current()
    try:
        worker.ensure_started()
    except Exception:  # noqa: BLE001 - a worker must come up; executions will report the cause
        log.exception("sandbox service failed to start")
    worker.ensure_pump(app)  # calls parked before this worker started wait for a pump too


@worker_process_shutdown.connect
def _stop_in_child(**_: Any) -> None:
    sandbox_worker.stop()
