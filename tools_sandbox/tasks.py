"""The sandbox Celery task: run one call, store its result, continue the run.

Bound with `shared_task`, so it joins whichever app the worker runs (worker/celery_app
includes this module and routes it to the `reactq.sandbox` queue). Delivery is
at-least-once (acks_late): a redelivered message finds its result already stored and
only re-sends the continuation, so code runs at most once per stored result and a run
is never lost. The warm-pool service is one per worker process: started at
worker_process_init when this worker consumes `reactq.sandbox` (never in the forking
parent, never in step workers), else lazily on first use; closed at shutdown.
"""

from __future__ import annotations

import atexit
import logging
import random
import threading
from typing import Any

import redis
from celery import shared_task
from celery.signals import celeryd_after_setup, worker_process_init, worker_process_shutdown
from pydantic import BaseModel, Field

from .config import SandboxSettings
from .errors import UnknownTierError
from .models import ErrorKind, SandboxResult
from .outcome import UNAVAILABLE_TEXT
from .service import SandboxService

log = logging.getLogger(__name__)

QUEUE = "reactq.sandbox"
TASK_NAME = "reactq.sandbox.execute"
RESULT_TTL_S = 7 * 24 * 3600
# A tenant at its concurrent-executions quota is back-pressure, not a failure: the call waits
# (re-queued with a short delay) for up to about this long before the rejection becomes its result.
CONCURRENCY_WAIT_S = 120.0
CONCURRENCY_RETRY_S = 0.5
# The only task a sandbox call may continue to: the worker's step task (tools_sandbox never imports
# worker; tests/test_sandbox_pool_task.py checks this name against worker's own constant).
STEP_TASK = "reactq.step"
ALLOWED_CONTINUATIONS = frozenset({STEP_TASK})

_lock = threading.Lock()
_service: SandboxService | None = None
_redis: redis.Redis | None = None
_prewarm = False


class ExecuteRequest(BaseModel):
    """The task's single argument."""

    code: str
    tier: str = "standard"
    tenant: str = "default"
    result_key: str
    continue_task: str | None = None
    continue_args: list[Any] = Field(default_factory=list)
    continue_queue: str | None = None


def get_service() -> SandboxService:
    """This process's sandbox service, started on first use."""
    global _service
    with _lock:
        if _service is None:
            settings = SandboxSettings()
            service = SandboxService(settings, redis_url=settings.redis_url)
            service.start()
            _service = service
        return _service


def close_service() -> None:
    global _service, _redis
    with _lock:
        if _service is not None:
            _service.close()
            _service = None
        if _redis is not None:
            _redis.close()
            _redis = None


def _store() -> redis.Redis:
    global _redis
    with _lock:
        if _redis is None:
            _redis = redis.Redis.from_url(SandboxSettings().redis_url, socket_timeout=10)
        return _redis


@celeryd_after_setup.connect
def _note_queues(sender: Any = None, instance: Any = None, **_: Any) -> None:
    global _prewarm
    try:
        _prewarm = QUEUE in instance.app.amqp.queues.consume_from
    except AttributeError:
        _prewarm = False


@worker_process_init.connect
def _start_in_child(**_: Any) -> None:
    if _prewarm:
        try:
            get_service()
        except Exception:  # noqa: BLE001 - a worker must come up; executions will report the cause
            log.exception("sandbox service failed to start at worker_process_init")


@worker_process_shutdown.connect
def _close_in_child(**_: Any) -> None:
    close_service()


atexit.register(close_service)


def run_request(req: ExecuteRequest) -> SandboxResult:
    """Execute one request through the process-wide service; never raises for the code's failures."""
    try:
        return get_service().execute(req.code, tier=req.tier, tenant=req.tenant)
    except UnknownTierError as exc:
        return SandboxResult(exit_code=None, stdout="", stderr="", tier=req.tier, error=f"unknown_tier: {exc}",
                             error_kind=ErrorKind.UNKNOWN_TIER, backend="none")
    except Exception:  # noqa: BLE001 - infrastructure failure becomes a visible result (details in the log)
        log.exception("sandbox execution failed")
        return SandboxResult(exit_code=None, stdout="", stderr="", tier=req.tier, error=UNAVAILABLE_TEXT,
                             error_kind=ErrorKind.UNAVAILABLE, backend="none")


def _waits_for_a_slot(result: SandboxResult) -> bool:
    return result.error_kind is ErrorKind.QUOTA_EXCEEDED and result.quota == "concurrent_executions"


@shared_task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True)
def execute(self: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Run the code unless its result is already stored, store it (SET NX), enqueue the continuation."""
    req = ExecuteRequest.model_validate(request)
    store = _store()
    try:
        if store.exists(req.result_key):
            outcome = "redelivered"
        else:
            result = run_request(req)
            if _waits_for_a_slot(result) and self.request.retries < CONCURRENCY_WAIT_S / CONCURRENCY_RETRY_S:
                raise self.retry(countdown=CONCURRENCY_RETRY_S * (1 + random.random()), max_retries=None)
            store.set(req.result_key, result.model_dump_json(), nx=True, ex=RESULT_TTL_S)
            outcome = result.outcome
    except redis.exceptions.ConnectionError as exc:
        raise self.retry(exc=exc, countdown=2, max_retries=30) from exc
    if req.continue_task in ALLOWED_CONTINUATIONS:
        self.app.send_task(req.continue_task, args=req.continue_args, queue=req.continue_queue)
    elif req.continue_task:
        log.warning("refused to continue sandbox call %s to task %r: only %s may follow a sandbox call",
                    req.result_key, req.continue_task, ", ".join(sorted(ALLOWED_CONTINUATIONS)))
    return {"result_key": req.result_key, "outcome": outcome}
