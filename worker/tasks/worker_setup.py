"""What makes a worker of this app a reactq worker, whether `reactq worker` or a plain
`celery -A worker.celery_app worker` starts it.

Celery's settings (worker/tasks/app.py) give it the threads pool, the queues it takes without -Q
(reactq.steps and reactq.sandbox), prefetch 1 and this module's consumer (no gossip, no mingle). The
signals here give it the rest, once per worker process:
- worker_init (after -Q, before the pool is made): reactq.webhooks leaves the pool's queues for a
  webhook worker beside it (worker/runtime/webhook_pool.py); the concurrency when -c is not given
  (200 threads for steps); the code the tasks run is loaded (the step runner, the LLM stack, webhook HTTP);
  a sandbox worker in this process publishes without Celery (worker/tasks/publish.py);
- setup_logging: the JSON logs of worker/logs.py instead of Celery's;
- celeryd_after_setup (logging is set up, the consumer not started yet): stdout and stderr to the log
  (worker_redirect_stdouts), /metrics on REACTQ_METRICS_PORT, and the webhook worker;
- worker_ready (the consumer takes messages): the probes learn which queues it consumes, and the reaper
  and its heartbeats start with the queues worker_init chose;
- worker_shutdown: the webhook worker and the MCP servers it started are stopped.
The SIGTERM drain is worker/tasks/steps.py's (worker_shutting_down); the sandbox worker of a worker that
takes reactq.sandbox is started by tools_sandbox's own task module (tools_sandbox/edges/tasks.py), which
does not import worker.
Celery's own flags (-Q, -X, -c, -P solo|threads|..., -E, --hostname, ...) win over these defaults; not
`-P prefork`, which Celery takes for its own default and replaces with worker_pool. A process that only
imports the app (the API, the CLI, tests) runs none of it: only a worker sends these signals, and only a
worker imports this module (it is in the app's `include`).
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Any

from celery import signals
from celery.utils.sysinfo import is_auto_concurrency
from celery.worker.consumer import Consumer as CeleryConsumer

from .. import logs
from ..config import get_settings
from ..names import STEPS_QUEUE, WEBHOOKS_QUEUE

log = logging.getLogger("reactq.worker")

STEP_THREADS = 200  # a step worker's threads: LLM calls are waits, hundreds in flight per process

_started: dict[str, Any] = {}  # what this process's worker set up: queues, beside, services, webhook_pool


def split_webhooks(queues: list[str], webhook_threads: int) -> tuple[list[str], bool]:
    """The queues a worker's own pool takes, and whether a webhook worker runs beside it: reactq.webhooks
    never shares a pool with another queue, and a step worker has one unless REACTQ_WEBHOOK_CONCURRENCY=0."""
    others = [q for q in queues if q != WEBHOOKS_QUEUE]
    beside = bool(others) and (WEBHOOKS_QUEUE in queues or (STEPS_QUEUE in queues and webhook_threads > 0))
    return (others if beside else queues), beside


def default_concurrency(queues: list[str], webhook_threads: int) -> int:
    """Threads when -c is not given: 200 with steps, REACTQ_WEBHOOK_CONCURRENCY for webhooks alone, else cores."""
    if STEPS_QUEUE in queues:
        return STEP_THREADS
    if queues == [WEBHOOKS_QUEUE]:
        return max(1, webhook_threads)
    return os.cpu_count() or 2


class Consumer(CeleryConsumer):
    """Celery's consumer as `--without-gossip --without-mingle` makes it: reactq needs no elections and no
    revokes synced between workers, and mingle makes every starting worker wait for the others' answers."""

    def __init__(self, *args: Any, worker_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        options = {**(worker_options or {}), "without_gossip": True, "without_mingle": True}
        super().__init__(*args, worker_options=options, **kwargs)


@signals.worker_init.connect(weak=False, dispatch_uid="reactq-worker-init")
def _configure_worker(sender: Any = None, **_: Any) -> None:
    """In the worker's main process, after Celery applied -Q/-X and before it makes the pool."""
    if "queues" in _started or sender is None:
        return
    settings = get_settings()
    selected = list(sender.app.amqp.queues.consume_from)
    queues, beside = split_webhooks(selected, settings.webhook_concurrency)
    if WEBHOOKS_QUEUE in selected and WEBHOOKS_QUEUE not in queues:
        sender.app.amqp.queues.deselect([WEBHOOKS_QUEUE])
    _started["queues"] = queues
    _started["beside"] = beside
    given = sender.options.get("concurrency")
    if not given and not sender.app.conf.worker_concurrency and not is_auto_concurrency(sender.concurrency):
        sender.concurrency = default_concurrency(queues, settings.webhook_concurrency)


@signals.worker_init.connect(weak=False, dispatch_uid="reactq-worker-load")
def _load_task_code(**_: Any) -> None:
    """What the tasks run, loaded as the worker starts (before its pool) rather than by its first tasks: the
    task modules and the runtime's builders import it where it is used, so that processes that only send
    tasks (`reactq batch`, the API) do without."""
    from ..llm import circuit, client, context_guard, in_flight, ratelimit  # noqa: F401
    from ..runtime import runner, webhook_http  # noqa: F401
    from ..store import cluster, llm_slots, provider_circuit, provider_limits  # noqa: F401

    if STEPS_QUEUE in _started.get("queues", [STEPS_QUEUE]):  # a worker that calls models
        client.preload()
    _publish_sandbox_messages()


def _publish_sandbox_messages() -> None:
    """A sandbox worker in this process sends its continuations and woken calls without Celery, as the steps
    send their calls, when the broker is a Redis (worker/tasks/publish.py)."""
    from tools_sandbox.edges import sandbox_worker

    from .steps import worker_publisher

    publisher = worker_publisher()
    if publisher is not None:
        sandbox_worker.publish_with(publisher.send_task)


@signals.celeryd_after_setup.connect(weak=False, dispatch_uid="reactq-worker-services")
def _start_services(instance: Any = None, **_: Any) -> None:
    """/metrics and the webhook worker, once, in the worker worker_init set up (its logs are JSON by now)."""
    if "queues" not in _started or "services" in _started or instance is None:
        return
    _started["services"] = True
    if instance.app.conf.worker_redirect_stdouts:  # where Celery would, had it set up the logging
        instance.app.log.redirect_stdouts(instance.app.conf.worker_redirect_stdouts_level)
    settings = get_settings()
    if getattr(instance.pool_cls, "__module__", "") == "celery.concurrency.prefork":
        log.warning("prefork pool: /metrics shows this main process only; reactq workers use -P threads")
    if settings.metrics_port:
        from ..runtime.context import get_runtime
        from ..runtime.metrics_server import start_metrics_server

        start_metrics_server(settings.metrics_port, get_runtime(get_settings))
    if _started["beside"]:
        from ..runtime.webhook_pool import WebhookPool

        level = logging.getLevelName(instance.loglevel)  # Celery's number for -l
        _started["webhook_pool"] = WebhookPool(max(1, settings.webhook_concurrency), level).start()


@signals.worker_ready.connect(weak=False, dispatch_uid="reactq-worker-ready")
def _start_background(sender: Any = None, **_: Any) -> None:
    """Once the consumer takes messages: the probes learn what it consumes, and the reaper and its heartbeats
    start (a heartbeat names the queues this worker serves)."""
    from ..runtime.context import get_runtime
    from ..runtime.metrics_server import HEALTH
    from ..runtime.reaper import start_reaper
    from .steps import celery_dispatch

    if sender is not None:
        queues = sender.app.amqp.queues
        HEALTH.consuming(queues.consume_from or queues)
    start_reaper(get_runtime(get_settings), celery_dispatch(), _started.get("queues", [STEPS_QUEUE]))


@signals.worker_ready.connect(weak=False, dispatch_uid="reactq-worker-settled")
def _freeze_set_up(**_: Any) -> None:
    """After the set-up (connected after _start_background, so run after it): the objects Celery's start and the
    task code made (~90,000 in a step worker, besides the ~90,000 frozen as its verb was resolved:
    worker/cli/collector.py) live as long as the worker. Collected once and frozen, they are left out of the
    collections its tasks cause, which then walk only what the tasks make."""
    gc.collect()
    gc.freeze()


@signals.worker_shutdown.connect(weak=False, dispatch_uid="reactq-worker-shutdown")
def _stop_webhook_worker(**_: Any) -> None:
    pool = _started.pop("webhook_pool", None)
    if pool is not None:
        pool.stop()
    from ..runtime.context import close_mcp_servers

    close_mcp_servers()


@signals.setup_logging.connect(weak=False, dispatch_uid="reactq-setup-logging")
def _json_logs(loglevel: Any = None, **_: Any) -> None:
    """Celery configures no logging of its own when this answers (nor redirects stdout and stderr to the log:
    _start_services does, as Celery would)."""
    logs.setup(loglevel or "INFO")
