"""One sandbox worker process's sandbox side: built once from settings, started and stopped in one place.

`SandboxWorker` owns the process's one Redis client, the quota gate on it, the calls' records (results and
pending markers, on the same client), the service (backend, warm pool, sweeper) and the line pump. The
Celery task (edges/tasks.py) hands each delivery to `handle`; `current()` is this process's worker (built
on first use, started when a delivery or the worker's start-up first needs it), `stop()` closes it.

Delivery is at-least-once (acks_late): a redelivered message finds its result already stored and only
re-sends the continuation, so code runs at most once per stored result and a run is never lost.

No call is ever dropped. A call over its tenant's concurrency or per-minute quota waits in its (tier,
tenant)'s line (base/quotas.py; its ticket is its result key, its place its `queued_at`): each delivery
asks for a slot once, and while the answer is "wait" the call is parked beside the line, or, a duplicate of
a call that is executing, re-sent with a countdown of a few seconds (never Celery's retry counter, never a
long block: a waiting call holds no worker process, so other tenants' calls go on), and the request's
`pending_key`, which tells the reaper the call is alive, is kept alive. When the request's `deadline_at`
(the run's deadline; default `queued_at` + REACTQ_SANDBOX_WAIT_MAX_S) passes in line, the call's result is
a `quota_exceeded` error saying so.

A call no backend can run (this worker's backend is down, or failed during the call, or anything of ours
broke) is not answered: it goes back to the queue with a growing countdown (1 s doubling to 30 s, never
Celery's retry counter), so another sandbox worker may take it, its pending marker kept alive meanwhile. A
worker whose backend is down stops consuming `reactq.sandbox` until a probe finds it back
(edges/health.py). Only once REACTQ_SANDBOX_UNAVAILABLE_S have passed since the call first found no
backend is its result `unavailable`, with the one fixed text (the cause is in the log, never in the
result), and its run ends failed (`sandbox_unavailable`). Every other way out ends with a stored result and
the continuation too; a Redis that stays unreachable past the task's retries leaves the call to the reaper
(worker/runtime/reaper.py re-sends it once its pending marker has expired, or ends the run at its deadline,
or as `sandbox_unavailable` when no sandbox worker could take it).
"""

from __future__ import annotations

import atexit
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import kombu.exceptions
from pydantic import ValidationError

from ..base import calls
from ..base.calls import UNREACHABLE, CallStore
from ..base.config import SandboxSettings
from ..base.errors import UnknownTierError
from ..base.metrics import CALLS_WAITING
from ..base.models import ErrorKind, SandboxResult, Tier
from ..base.names import SANDBOX_QUEUE, SANDBOX_TASK, STEP_TASK
from ..base.quotas import IN_PROGRESS, QuotaGate, Wait
from ..base.render import UNAVAILABLE_TEXT
from ..base.request import ExecuteRequest
from ..base.session import session_full_text, session_program
from .service import SandboxService

log = logging.getLogger(__name__)

# The only task a sandbox call may continue to: the worker's step task.
ALLOWED_CONTINUATIONS = frozenset({STEP_TASK})
# A waiting call looks again after at most this long (and the line drops a ticket quiet for 30 s).
MAX_POLL_S = 5.0
# How often each sandbox worker process wakes the lines whose capacity freed without a wake.
PUMP_S = 1.0
RUNNING_MARK_GRACE_S = 15.0
# A call no backend could run is sent again after this long, doubling up to the most.
UNAVAILABLE_RETRY_FIRST_S = 1.0
UNAVAILABLE_RETRY_MAX_S = 30.0
# Redis or the broker not answering: the task retries the delivery (edges/tasks.py).
UNREACHABLE_SERVICES: tuple[type[Exception], ...] = (*UNREACHABLE, kombu.exceptions.OperationalError)


# (task, args, queue, priority): how this process sends a continuation or a woken call, when not through
# Celery's send_task. The worker package installs one that writes the same message without Celery
# (worker/tasks/publish.py, worker_setup.py): Celery's send_task was a fifth of a sandbox worker's time.
Send = Callable[[str, list[Any], str, "int | None"], None]
_send: Send | None = None


def publish_with(send: Send | None) -> None:
    """Send this process's continuations and woken calls with `send` (None: with Celery's send_task)."""
    global _send
    _send = send


def _publish(app: Any, task: str, args: list[Any], queue: str | None, priority: int | None = None) -> None:
    if _send is not None and queue is not None:
        _send(task, args, queue, priority)
    else:
        # declare=[]: the workers declare their queues; declaring one again on every publish costs CPU and
        # sends nothing (as worker/tasks/steps.py's send_step)
        app.send_task(task, args=args, queue=queue, priority=priority, declare=[])


class Delivery(StrEnum):
    """What one delivery of a call came to."""

    ANSWERED = "answered"  # a result to store (the task reports the result's own outcome)
    REDELIVERED = "redelivered"  # its result was stored already: only the continuation goes again
    WAITING = "waiting"  # it waits in its tenant's line (parked, or re-sent with a countdown)
    RETRYING = "unavailable_retry"  # no backend could run it: re-sent for any sandbox worker


@dataclass(frozen=True)
class Attempt:
    """A delivery's end: what it came to, and the result to store when ANSWERED (`stored`: stored already,
    before the call's slot was freed)."""

    delivery: Delivery
    result: SandboxResult | None = None
    stored: bool = False

    @property
    def outcome(self) -> str:
        """The task's reported outcome: the result's (ok, error, an error kind) or the delivery's."""
        return self.result.outcome if self.result is not None else self.delivery.value


REDELIVERED = Attempt(Delivery.REDELIVERED)
WAITING = Attempt(Delivery.WAITING)
RETRYING = Attempt(Delivery.RETRYING)


class SandboxWorker:
    """A sandbox worker process's sandbox side. Building it connects nothing; `ensure_started` starts the
    service (again after a start that raised), `ensure_pump` the line pump; `stop` ends all of it."""

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.client = calls.connect(self.settings.redis_url)
        self.quotas = QuotaGate(client=self.client, waiter_stale_s=self.settings.sandbox_waiter_stale_s)
        self.service = SandboxService(self.settings, quotas=self.quotas)
        self.calls = CallStore(self.client)
        self._lock = threading.Lock()
        self._started = False
        self._stopped = threading.Event()
        self._pump: threading.Thread | None = None

    def ensure_started(self) -> SandboxService:
        with self._lock:
            if not self._started:
                self.service.start()
                self._started = True
            return self.service

    def ensure_pump(self, app: Any) -> None:
        """Run the line pump in this process (calls parked before this worker started wait for one too)."""
        with self._lock:
            if not self._stopped.is_set() and (self._pump is None or not self._pump.is_alive()):
                self._pump = threading.Thread(target=self._pump_lines, args=(app,), name="sandbox-line-pump",
                                              daemon=True)
                self._pump.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join(timeout=2 * PUMP_S + 10)
        with self._lock:
            self.service.close()
            self._started = False
        self.client.close()

    # --- one delivery -------------------------------------------------------------------------------
    def handle(self, task: Any, req: ExecuteRequest) -> Attempt:
        """Run the call unless its result is stored already, or have it wait in line; store the result (SET NX)
        and send the continuation. Anything of ours that breaks sends the call again like one no backend
        could run; an unreachable Redis or broker is raised, for the task to retry."""
        try:
            attempt = self._attempt(task, req)
        except UNREACHABLE_SERVICES:
            raise
        except Exception:  # noqa: BLE001 - our failure: sent again like a call with no backend (details logged)
            log.exception("sandbox call %s failed", req.result_key)
            self._leave_line(req)
            attempt = self._no_backend(task, req)
        if attempt.delivery in (Delivery.WAITING, Delivery.RETRYING):
            return attempt
        if attempt.result is not None and not attempt.stored:
            self.calls.store(req, attempt.result)
        self._continue(task, req)
        if attempt.delivery is not Delivery.REDELIVERED:
            try:
                self.wake_line(task.app, req.tier, req.tenant)  # the slot it held is free: the next in line goes
            except Exception:  # noqa: BLE001 - the pump wakes them within a second instead
                log.debug("could not wake the line of %s", req.result_key, exc_info=True)
        return attempt

    def _attempt(self, task: Any, req: ExecuteRequest) -> Attempt:
        if self.calls.answered(req):
            return REDELIVERED
        service = self.ensure_started()
        settings = self.settings
        if not service.up:
            return self._no_backend(task, req)
        now = time.time()
        queued_at = req.queued_at if req.queued_at is not None else now
        deadline = req.deadline_at if req.deadline_at is not None else queued_at + settings.sandbox_wait_max_s
        try:
            verdict = service.admit(req.tier, req.tenant, ticket=req.result_key, arrival=queued_at, now=now)
        except UnknownTierError as exc:
            return Attempt(Delivery.ANSWERED, _blank(req, f"unknown_tier: {exc}", ErrorKind.UNKNOWN_TIER))
        if isinstance(verdict, Wait):
            if now >= deadline:
                return Attempt(Delivery.ANSWERED, service.gave_up(verdict, req.result_key))
            self.calls.keep_pending(req, settings.sandbox_pending_ttl_s)
            if verdict.quota == IN_PROGRESS:
                _wait_in_line(task, req, verdict, queued_at, settings.sandbox_wait_poll_s)
            else:
                again = req.model_copy(update={"queued_at": queued_at, "deadline_at": deadline, "waits": req.waits + 1})
                self.quotas.park(req.tier, req.tenant, req.result_key, again.model_dump_json(), deadline)
                self.ensure_pump(task.app)
            return WAITING
        if isinstance(verdict, SandboxResult):
            return Attempt(Delivery.ANSWERED, verdict)  # the CPU-day quota refused it
        if self.calls.answered(req):  # a duplicate's result was stored (then its slot freed) meanwhile
            service.release_unused(verdict)
            return REDELIVERED
        # While it runs: its wall time (the host kills it then) and a little for a container start. A worker
        # that dies mid-execution leaves the marker to lapse soon, so the reaper re-sends the call (its
        # duplicate then waits, `in_progress`, until the dead worker's slot expires).
        self.calls.keep_pending(req, verdict.tier.wall_time_s + RUNNING_MARK_GRACE_S)

        def keep(result: SandboxResult) -> None:
            if result.error_kind is not ErrorKind.UNAVAILABLE:
                self.calls.store(req, result)

        program = _program(req, verdict.tier)
        if program is None:
            service.release_unused(verdict)
            return Attempt(Delivery.ANSWERED, _blank(req, session_full_text(verdict.tier.session_max_cells),
                                                     None))
        result = service.run_admitted(program, verdict, req.tenant, keep=keep)
        if result.error_kind is ErrorKind.UNAVAILABLE:
            return self._no_backend(task, req)
        return Attempt(Delivery.ANSWERED, result, stored=True)  # by `keep`

    def _no_backend(self, task: Any, req: ExecuteRequest) -> Attempt:
        """A call no backend could run: back to the queue with a growing countdown (RETRYING), or, once it has
        found none for REACTQ_SANDBOX_UNAVAILABLE_S, its `unavailable` result (the one fixed text, no cause)."""
        now = time.time()
        since = req.unavailable_since if req.unavailable_since is not None else now
        window = self.settings.sandbox_unavailable_s
        if now - since >= window:
            log.error("sandbox call %s: no sandbox backend could run it for %.0f s; its run ends failed",
                      req.result_key, now - since)
            return Attempt(Delivery.ANSWERED, _blank(req, UNAVAILABLE_TEXT, ErrorKind.UNAVAILABLE))
        countdown = min(UNAVAILABLE_RETRY_FIRST_S * 2 ** min(req.unavailable_tries, 10), UNAVAILABLE_RETRY_MAX_S)
        countdown = min(countdown * (1 + random.random() / 4), max(0.2, since + window - now))
        again = req.model_copy(update={"unavailable_since": since, "unavailable_tries": req.unavailable_tries + 1})
        self.calls.keep_pending(req, countdown + self.settings.sandbox_pending_ttl_s)
        if req.unavailable_tries % 10 == 0:
            log.warning("sandbox call %s found no backend to run it (try %d); sent again in %.1f s",
                        req.result_key, req.unavailable_tries + 1, countdown)
        task.apply_async(args=[again.model_dump()], countdown=countdown, queue=SANDBOX_QUEUE)
        return RETRYING

    def _continue(self, task: Any, req: ExecuteRequest) -> None:
        if req.continue_task in ALLOWED_CONTINUATIONS:
            _publish(task.app, req.continue_task, req.continue_args, req.continue_queue, req.continue_priority)
        elif req.continue_task:
            log.warning("refused to continue sandbox call %s to task %r: only %s may follow a sandbox call",
                        req.result_key, req.continue_task, ", ".join(sorted(ALLOWED_CONTINUATIONS)))

    def _leave_line(self, req: ExecuteRequest) -> None:
        try:
            self.service.leave_line(req.tier, req.tenant, req.result_key)
        except Exception:  # noqa: BLE001 - best effort: a ticket gone quiet leaves the line by itself
            log.debug("could not take %s out of its line", req.result_key, exc_info=True)

    # --- the lines ----------------------------------------------------------------------------------
    def wake_line(self, app: Any, tier: str, tenant: str) -> int:
        """Send again the parked calls of a line whose turn has come (or whose deadline passed); how many."""
        spec = self.ensure_started().tiers.get(tier)
        if spec is None:
            return 0
        woken = self.quotas.wake(spec, tenant)
        for n, raw in enumerate(woken):
            try:
                _publish(app, SANDBOX_TASK, [json.loads(raw)], SANDBOX_QUEUE)
            except Exception:  # noqa: BLE001 - the broker is down: put them back for the next wake
                for back in woken[n:]:
                    again = ExecuteRequest.model_validate_json(back)
                    self.quotas.park(tier, tenant, again.result_key, back.decode(), again.deadline_at or time.time())
                raise
        return len(woken)

    def _pump_lines(self, app: Any) -> None:
        """Every second, wake the parked calls of every line whose capacity freed without a wake (a slot
        that expired with a dead worker, a new minute) and keep their pending markers alive."""
        last_marks = 0.0
        while not self._stopped.wait(PUMP_S):
            try:
                service = self.ensure_started()
                refresh = time.time() - last_marks > self.settings.sandbox_pending_ttl_s / 3
                waiting = dict.fromkeys(service.tiers, 0)
                for tier, tenant in self.quotas.parked_lines():
                    self.wake_line(app, tier, tenant)
                    if refresh:
                        self._refresh_markers(tier, tenant)
                    if tier in waiting:
                        waiting[tier] += self.quotas.parked_count(tier, tenant)
                for tier, n in waiting.items():
                    CALLS_WAITING.labels(tier=tier).set(n)
                if refresh:
                    last_marks = time.time()
            except Exception:  # noqa: BLE001 - Redis or the broker restarting: try again next round
                log.debug("sandbox line pump round failed", exc_info=True)

    def _refresh_markers(self, tier: str, tenant: str) -> None:
        for raw in self.quotas.parked(tier, tenant):
            try:
                self.calls.keep_pending(ExecuteRequest.model_validate_json(raw), self.settings.sandbox_pending_ttl_s)
            except ValidationError:
                continue


def _program(req: ExecuteRequest, tier: Tier) -> str | None:
    """What the execution runs: the code, or a session's replay and then the code (None: more earlier cells
    than the tier replays)."""
    if req.session is None:
        return req.code
    if len(req.session) > tier.session_max_cells:
        return None
    replay_s = tier.session_replay_s if tier.session_replay_s is not None else tier.wall_time_s / 2
    return session_program(req.session, req.code, replay_s)


def _blank(req: ExecuteRequest, error: str, kind: ErrorKind | None) -> SandboxResult:
    return SandboxResult(exit_code=None, stdout="", stderr="", tier=req.tier, error=error, error_kind=kind,
                         backend="none")


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
    task.apply_async(args=[again.model_dump()], countdown=countdown * (1 + random.random() / 2), queue=SANDBOX_QUEUE)


# --- this process's worker -----------------------------------------------------------------------------
_lock = threading.Lock()
_current: SandboxWorker | None = None


def current() -> SandboxWorker:
    """This process's sandbox worker, built on first use (from the environment's settings) and stopped at exit."""
    global _current
    with _lock:
        if _current is None:
            _current = SandboxWorker()
        return _current


def stop() -> None:
    """Stop this process's sandbox worker, if it has one (the next `current()` builds a new one)."""
    global _current
    with _lock:
        worker, _current = _current, None
    if worker is not None:
        worker.stop()


atexit.register(stop)
