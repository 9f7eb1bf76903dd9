"""The sandbox Celery task: run one call, store its result, continue the run.

Bound with `shared_task`, so it joins whichever app the worker runs (worker/celery_app
includes this module and routes it to the `reactq.sandbox` queue). Delivery is
at-least-once (acks_late): a redelivered message finds its result already stored and
only re-sends the continuation, so code runs at most once per stored result and a run
is never lost. The warm-pool service is one per worker process: started at
worker_process_init when this worker consumes `reactq.sandbox` (never in the forking
parent, never in step workers), else lazily on first use; closed at shutdown.

No call is ever dropped. A call over its tenant's concurrency or per-minute quota waits in
its (tier, tenant)'s line (tools_sandbox/base/quotas.py; its ticket is its result key, its place
its `queued_at`): each delivery asks for a slot once, and while the answer is "wait" the task
re-sends itself with a countdown of a few seconds (never Celery's retry counter, never a long
block: a waiting call holds no worker process, so other tenants' calls go on) and refreshes the
request's `pending_key`, which tells the reaper the call is alive. When the request's
`deadline_at` (the run's deadline; default `queued_at` + REACTQ_SANDBOX_WAIT_MAX_S) passes in
line, the call's result is a `quota_exceeded` error saying so.

A call no backend can run (this worker's backend is down, or failed during the call, or anything of
ours broke) is not answered: it goes back to the queue with a growing countdown (1 s doubling to 30 s,
never Celery's retry counter), so another sandbox worker may take it, its pending marker kept alive
meanwhile. A worker whose backend is down stops consuming `reactq.sandbox` until a probe finds it
back (tools_sandbox/edges/health.py). Only once REACTQ_SANDBOX_UNAVAILABLE_S have passed since the call
first found no backend is its result `unavailable`, with a fixed text (the cause is in the log, never
in the result), and its run ends failed (`sandbox_unavailable`). Every other way out ends with a
stored result and the continuation too; a Redis that stays unreachable past the retries leaves
the call to the reaper (worker/runtime/reaper.py re-sends it once its pending marker has expired, or
ends the run at its deadline, or as `sandbox_unavailable` when no sandbox worker could take it).
"""

from __future__ import annotations

import atexit
import json
import logging
import random
import threading
import time
from typing import Any

import kombu.exceptions
import redis
from celery import current_app, shared_task
from celery.signals import celeryd_after_setup, worker_process_init, worker_process_shutdown, worker_ready
from pydantic import ValidationError

from ..base.config import SandboxSettings
from ..base.errors import UnknownTierError
from ..base.metrics import CALLS_WAITING
from ..base.models import ErrorKind, SandboxResult
from ..base.names import SANDBOX_QUEUE, SANDBOX_TASK, STEP_TASK
from ..base.quotas import IN_PROGRESS, Wait
from ..base.render import UNAVAILABLE_TEXT
from ..base.request import ExecuteRequest
from . import health
from .service import SandboxService

log = logging.getLogger(__name__)

QUEUE = SANDBOX_QUEUE
TASK_NAME = SANDBOX_TASK
RESULT_TTL_S = 7 * 24 * 3600
# A Redis that does not answer: the delivery is retried (Celery's retry, this many times, 2 s apart).
REDIS_RETRIES = 30
REDIS_RETRY_S = 2
# A waiting call looks again after at most this long (and the line drops a ticket quiet for 30 s).
MAX_POLL_S = 5.0
# The only task a sandbox call may continue to: the worker's step task.
ALLOWED_CONTINUATIONS = frozenset({STEP_TASK})

_lock = threading.Lock()
_service: SandboxService | None = None
_redis: redis.Redis | None = None
_prewarm = False
_pump_thread: threading.Thread | None = None
# How often each sandbox worker process wakes the lines whose capacity freed without a wake.
PUMP_S = 1.0
RUNNING_MARK_GRACE_S = 15.0
# A call no backend could run is sent again after this long, doubling up to the most.
UNAVAILABLE_RETRY_FIRST_S = 1.0
UNAVAILABLE_RETRY_MAX_S = 30.0
RETRYING = "unavailable_retry"


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


@worker_ready.connect
def _start_in_worker(sender: Any = None, **_: Any) -> None:
    """A worker whose pool runs tasks in its own process (threads, the reactq default) has no child to
    start the service in: start it, and the line pump, here once the worker is ready."""
    pool = str(getattr(getattr(sender, "controller", None), "pool_cls", "") or getattr(sender, "pool_cls", ""))
    if "prefork" not in pool:
        if _prewarm and hasattr(sender, "call_soon"):
            health.on_change(lambda up: _consume(sender))
        _start_in_child()
        if _prewarm and hasattr(sender, "call_soon"):
            _consume(sender)


def _consume(consumer: Any) -> None:
    """Take sandbox tasks only while the backend can run them. The change runs in the consumer's own loop
    before it next fetches a message (as Celery's add_consumer/cancel_consumer control commands do), and
    follows the backend's state when it runs, so changes queued in any order end in the right one."""

    def follow() -> None:
        if get_service().up:
            consumer.add_task_queue(QUEUE)
        elif consumer.task_consumer is not None and consumer.task_consumer.consuming_from(QUEUE):
            consumer.cancel_task_queue(QUEUE)

    consumer.call_soon(follow)


@worker_process_init.connect
def _start_in_child(**_: Any) -> None:
    if _prewarm:
        try:
            get_service()
        except Exception:  # noqa: BLE001 - a worker must come up; executions will report the cause
            log.exception("sandbox service failed to start at worker_process_init")
        _ensure_pump(current_app)  # calls parked before this worker started wait for a pump too


@worker_process_shutdown.connect
def _close_in_child(**_: Any) -> None:
    close_service()


atexit.register(close_service)


_EXTEND = """
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('SET', KEYS[1], '1', 'PX', ms)
end
"""


def _blank(req: ExecuteRequest, error: str, kind: ErrorKind) -> SandboxResult:
    return SandboxResult(exit_code=None, stdout="", stderr="", tier=req.tier, error=error, error_kind=kind,
                         backend="none")


def _no_backend(task: Any, req: ExecuteRequest, store: redis.Redis, settings: SandboxSettings) -> SandboxResult | str:
    """A call no backend could run: back to the queue with a growing countdown (RETRYING), or, once it has
    found none for REACTQ_SANDBOX_UNAVAILABLE_S, its `unavailable` result (fixed text, no cause)."""
    now = time.time()
    since = req.unavailable_since if req.unavailable_since is not None else now
    window = settings.sandbox_unavailable_s
    if now - since >= window:
        log.error("sandbox call %s: no sandbox backend could run it for %.0f s; its run ends failed",
                  req.result_key, now - since)
        return _blank(req, UNAVAILABLE_TEXT, ErrorKind.UNAVAILABLE)
    countdown = min(UNAVAILABLE_RETRY_FIRST_S * 2 ** min(req.unavailable_tries, 10), UNAVAILABLE_RETRY_MAX_S)
    countdown = min(countdown * (1 + random.random() / 4), max(0.2, since + window - now))
    again = req.model_copy(update={"unavailable_since": since, "unavailable_tries": req.unavailable_tries + 1})
    _mark_pending(store, req, countdown + settings.sandbox_pending_ttl_s)
    if req.unavailable_tries % 10 == 0:
        log.warning("sandbox call %s found no backend to run it (try %d); sent again in %.1f s",
                    req.result_key, req.unavailable_tries + 1, countdown)
    task.apply_async(args=[again.model_dump()], countdown=countdown, queue=QUEUE)
    return RETRYING


def _mark_pending(store: redis.Redis, req: ExecuteRequest, ttl_s: float) -> None:
    """Keep the request's pending marker alive for at least `ttl_s` more (never shortened)."""
    if req.pending_key:
        store.eval(_EXTEND, 1, req.pending_key, int(ttl_s * 1000))


WAITING = "waiting"


def _attempt(task: Any, req: ExecuteRequest, store: redis.Redis) -> SandboxResult | str:
    """One delivery's go at the call: its result to store, "redelivered" (stored already), WAITING
    (re-queued to wait in line) or RETRYING (no backend: re-queued for any sandbox worker)."""
    if store.exists(req.result_key):
        return "redelivered"
    service = get_service()
    settings = service.settings
    if not service.up:
        return _no_backend(task, req, store, settings)
    now = time.time()
    queued_at = req.queued_at if req.queued_at is not None else now
    deadline = req.deadline_at if req.deadline_at is not None else queued_at + settings.sandbox_wait_max_s
    try:
        verdict = service.admit(req.tier, req.tenant, ticket=req.result_key, arrival=queued_at, now=now)
    except UnknownTierError as exc:
        return _blank(req, f"unknown_tier: {exc}", ErrorKind.UNKNOWN_TIER)
    if isinstance(verdict, Wait):
        if now >= deadline:
            return service.gave_up(verdict, req.result_key)
        _mark_pending(store, req, settings.sandbox_pending_ttl_s)
        if verdict.quota == IN_PROGRESS or service.quotas is None:
            _wait_in_line(task, req, verdict, queued_at, settings.sandbox_wait_poll_s)
        else:
            again = req.model_copy(update={"queued_at": queued_at, "deadline_at": deadline, "waits": req.waits + 1})
            service.quotas.park(req.tier, req.tenant, req.result_key, again.model_dump_json(), deadline)
            _ensure_pump(task.app)
        return WAITING
    if isinstance(verdict, SandboxResult):
        return verdict  # the CPU-day quota refused it
    if store.exists(req.result_key):  # a duplicate's result was stored (then its slot freed) meanwhile
        service.release_unused(verdict)
        return "redelivered"
    # While it runs: its wall time (the host kills it then) and a little for a container start. A worker
    # that dies mid-execution leaves the marker to lapse soon, so the reaper re-sends the call (its
    # duplicate then waits, `in_progress`, until the dead worker's slot expires).
    _mark_pending(store, req, verdict.tier.wall_time_s + RUNNING_MARK_GRACE_S)

    def keep(result: SandboxResult) -> None:
        if result.error_kind is not ErrorKind.UNAVAILABLE:
            _store_result(store, req, result)

    result = service.run_admitted(req.code, verdict, req.tenant, keep=keep)
    if result.error_kind is ErrorKind.UNAVAILABLE:
        return _no_backend(task, req, store, settings)
    return result


def _wait_in_line(task: Any, req: ExecuteRequest, wait: Wait, queued_at: float, poll_s: float) -> None:
    """Re-send the call with a short countdown: sooner near the head of the line, at most MAX_POLL_S (a
    duplicate of a call that is executing waits so for the other's result; other waits are parked)."""
    countdown = min(poll_s * (1 + wait.position / 4), MAX_POLL_S)
    if wait.quota == "executions_per_minute":
        countdown = max(countdown, min(wait.retry_in_s, MAX_POLL_S))
    again = req.model_copy(update={"queued_at": queued_at, "waits": req.waits + 1})
    if again.waits % 50 == 1:
        log.info("sandbox call %s waits in line (%s, position %d, %d waits)", req.result_key, wait.quota,
                 wait.position, again.waits)
    task.apply_async(args=[again.model_dump()], countdown=countdown * (1 + random.random() / 2), queue=QUEUE)


def wake_line(app: Any, tier: str, tenant: str) -> int:
    """Send again the parked calls of a line whose turn has come (or whose deadline passed); how many."""
    service = get_service()
    spec = service.tiers.get(tier)
    if service.quotas is None or spec is None:
        return 0
    woken = service.quotas.wake(spec, tenant)
    for n, raw in enumerate(woken):
        try:
            app.send_task(TASK_NAME, args=[json.loads(raw)], queue=QUEUE)
        except Exception:  # noqa: BLE001 - the broker is down: put them back for the next wake
            for back in woken[n:]:
                again = ExecuteRequest.model_validate_json(back)
                service.quotas.park(tier, tenant, again.result_key, back.decode(), again.deadline_at or time.time())
            raise
    return len(woken)


def _pump(app: Any) -> None:
    """Every second, wake the parked calls of every line whose capacity freed without a wake (a slot
    that expired with a dead worker, a new minute) and keep their pending markers alive."""
    last_marks = 0.0
    while True:
        time.sleep(PUMP_S)
        try:
            service = get_service()
            if service.quotas is None:
                continue
            refresh = time.time() - last_marks > service.settings.sandbox_pending_ttl_s / 3
            waiting = dict.fromkeys(service.tiers, 0)
            for tier, tenant in service.quotas.parked_lines():
                wake_line(app, tier, tenant)
                if refresh:
                    _refresh_markers(service, tier, tenant)
                if tier in waiting:
                    waiting[tier] += service.quotas.parked_count(tier, tenant)
            for tier, n in waiting.items():
                CALLS_WAITING.labels(tier=tier).set(n)
            if refresh:
                last_marks = time.time()
        except Exception:  # noqa: BLE001 - Redis or the broker restarting: try again next round
            log.debug("sandbox line pump round failed", exc_info=True)


def _refresh_markers(service: SandboxService, tier: str, tenant: str) -> None:
    assert service.quotas is not None
    store = _store()
    for raw in service.quotas.parked(tier, tenant):
        try:
            _mark_pending(store, ExecuteRequest.model_validate_json(raw), service.settings.sandbox_pending_ttl_s)
        except ValidationError:
            continue


def _ensure_pump(app: Any) -> None:
    global _pump_thread
    with _lock:
        if _pump_thread is None or not _pump_thread.is_alive():
            _pump_thread = threading.Thread(target=_pump, args=(app,), name="sandbox-line-pump", daemon=True)
            _pump_thread.start()


def _store_result(store: redis.Redis, req: ExecuteRequest, result: SandboxResult) -> None:
    store.set(req.result_key, result.model_dump_json(), nx=True, ex=RESULT_TTL_S)


def _continue(task: Any, req: ExecuteRequest) -> None:
    if req.continue_task in ALLOWED_CONTINUATIONS:
        task.app.send_task(req.continue_task, args=req.continue_args, queue=req.continue_queue)
    elif req.continue_task:
        log.warning("refused to continue sandbox call %s to task %r: only %s may follow a sandbox call",
                    req.result_key, req.continue_task, ", ".join(sorted(ALLOWED_CONTINUATIONS)))


def _leave_line(req: ExecuteRequest) -> None:
    try:
        get_service().leave_line(req.tier, req.tenant, req.result_key)
    except Exception:  # noqa: BLE001 - best effort: a ticket gone quiet leaves the line by itself
        log.debug("could not take %s out of its line", req.result_key, exc_info=True)


@shared_task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=REDIS_RETRIES)
def execute(self: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Run the code unless its result is already stored, or wait in line for a slot (re-queued); store the
    result (SET NX) and enqueue the continuation. Every way out stores a result, re-queues the call, or
    (Redis gone for good) leaves it to the reaper, logged."""
    try:
        req = ExecuteRequest.model_validate(request)
    except ValidationError:
        log.error("sandbox request refused (invalid; the run's reaper will see it unanswered): %r",
                  request, exc_info=True)
        return {"result_key": None, "outcome": "invalid_request"}
    store = _store()
    try:
        try:
            outcome = _attempt(self, req, store)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                kombu.exceptions.OperationalError):
            raise
        except Exception:  # noqa: BLE001 - our failure: sent again like a call with no backend (details logged)
            log.exception("sandbox call %s failed", req.result_key)
            _leave_line(req)
            outcome = _no_backend(self, req, store, SandboxSettings())
        if outcome in (WAITING, RETRYING):
            return {"result_key": req.result_key, "outcome": outcome}
        if isinstance(outcome, SandboxResult):
            _store_result(store, req, outcome)
            outcome = outcome.outcome
        _continue(self, req)
        if outcome != "redelivered":
            try:
                wake_line(self.app, req.tier, req.tenant)  # the slot it held is free: the next in line goes
            except Exception:  # noqa: BLE001 - the pump wakes them within a second instead
                log.debug("could not wake the line of %s", req.result_key, exc_info=True)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            kombu.exceptions.OperationalError) as exc:
        if self.request.retries >= REDIS_RETRIES:
            log.error("sandbox call %s: Redis unreachable after %d retries; its run's reaper re-sends it once "
                      "its pending marker expires", req.result_key, REDIS_RETRIES)
            raise
        raise self.retry(exc=exc, countdown=REDIS_RETRY_S, max_retries=REDIS_RETRIES) from exc
    return {"result_key": req.result_key, "outcome": outcome}
