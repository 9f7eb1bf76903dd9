"""The Celery app: Redis broker, at-least-once delivery, queues reactq.steps, reactq.sandbox, reactq.webhooks."""

from __future__ import annotations

from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from .. import logs
from ..config import get_settings
from ..names import PRIORITY_STEPS, SANDBOX_QUEUE, SANDBOX_TASK, STEP_TASK, STEPS_QUEUE, WEBHOOK_TASK, WEBHOOKS_QUEUE
from .broker import transport_for


def make_app() -> Celery:
    settings = get_settings()
    broker = settings.celery_broker_url
    sentinel = {"master_name": settings.broker_sentinel_master} if broker.startswith("sentinel://") else {}
    app = Celery("reactq", broker=broker,
                 include=["worker.tasks.steps", "worker.tasks.webhooks", "worker.tasks.health",
                          "tools_sandbox.edges.tasks", "worker.tasks.worker_setup"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=STEPS_QUEUE,
        task_routes={STEP_TASK: {"queue": STEPS_QUEUE}, SANDBOX_TASK: {"queue": SANDBOX_QUEUE},
                     WEBHOOK_TASK: {"queue": WEBHOOKS_QUEUE}},
        worker_prefetch_multiplier=1,
        # A plain `celery -A worker.celery_app worker` is a reactq worker (worker/tasks/worker_setup.py):
        # a threads pool (LLM calls and sandbox runs are waits; one process, one /metrics registry), sized
        # by its queues at worker_init unless -c is given (worker_concurrency unset); without -Q it takes
        # the queues below, each as Celery would declare it; reactq.webhooks goes to the webhook worker
        # beside a step worker.
        worker_pool="threads",
        task_queues=[Queue(q, Exchange(q), routing_key=q) for q in (STEPS_QUEUE, SANDBOX_QUEUE)],
        worker_consumer="worker.tasks.worker_setup:Consumer",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_transport=transport_for(broker),
        # Sized for a threads pool holding hundreds of LLM calls in flight.
        broker_pool_limit=settings.redis_max_connections,
        redis_max_connections=settings.redis_max_connections,
        broker_transport_options={
            # A message taken by a worker that died comes back after this; above the longest step.
            "visibility_timeout": settings.visibility_timeout_s,
            "max_connections": settings.redis_max_connections,
            "socket_keepalive": True,
            # One list per priority; a worker takes the highest first (worker/tenancy/fairness.py).
            "priority_steps": PRIORITY_STEPS,
            **sentinel,
        },
    )
    return app


app = make_app()


# Every line logged while a task runs carries its run id and step (Celery logs its 'succeeded' line
# before postrun).
@signals.task_prerun.connect(weak=False, dispatch_uid="reactq-logs-prerun")
def _bind_log_fields(task: Any = None, args: Any = None, **_: Any) -> None:
    logs.bind_task(getattr(task, "name", ""), args)


@signals.task_postrun.connect(weak=False, dispatch_uid="reactq-logs-postrun")
def _unbind_log_fields(**_: Any) -> None:
    logs.unbind_task()
