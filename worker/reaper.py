"""Finds runs that stopped moving (a worker died, a message was lost) and re-enqueues their step.

Runs are re-kicked when no progress was recorded for `stale_after_s`, no worker holds their lease,
and the queues are empty (so a run merely waiting in a long queue is left alone) — or whatever the
queues hold once they have been stale for longer than the broker's visibility timeout.
Only one reaper in the cluster works at a time (a Redis lock). It also samples queue depths.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from . import keys, metrics
from .approvals import expire_or_defer
from .celery_app import SANDBOX_QUEUE, STEPS_QUEUE
from .core.models import RunStatus
from .runner import record_finished
from .runtime import Runtime

log = logging.getLogger("reactq.reaper")
QUEUES = (STEPS_QUEUE, SANDBOX_QUEUE)


def queue_depths(rt: Runtime) -> dict[str, int]:
    pipe = rt.redis.pipeline(transaction=False)
    for queue in QUEUES:
        pipe.llen(queue)
    return dict(zip(QUEUES, pipe.execute(), strict=True))


def reap_once(rt: Runtime, send_step: Callable[[str, int], None], now: float | None = None) -> list[str]:
    """One pass; returns the ids of the runs re-kicked."""
    now = now or time.time()
    s = rt.settings
    depths = queue_depths(rt)
    for queue, depth in depths.items():
        metrics.QUEUE_DEPTH.labels(queue).set(depth)
    metrics.RUNS_IN_PROGRESS.set(rt.store.active_count())
    if not rt.redis.set(keys.REAPER_LOCK, "1", nx=True, ex=max(1, int(s.reaper_interval_s))):
        return []
    queues_empty = not any(depths.values())
    candidates = rt.store.stale_runs(now - s.stale_after_s)
    kicked = []
    for run_id, run in zip(candidates, rt.store.load_runs(candidates), strict=True):
        if run is None or run.status.finished:  # a missing record (expired, or lost with Redis data) too
            rt.redis.zrem(keys.ACTIVE_RUNS, run_id)
            continue
        if run.status == RunStatus.AWAITING_APPROVAL:  # nothing to re-kick: a person's decision moves it
            if (ended := expire_or_defer(rt, run, now)) is not None:
                record_finished(ended)
            continue
        long_stale = run.updated_at < now - s.visibility_timeout_s
        if rt.store.lease_held(run.id) or not (queues_empty or long_stale):
            continue
        log.warning("re-kicking stale run", extra={"run_id": run.id, "step": run.current_step})
        rt.store.touch_active(run.id)
        send_step(run.id, run.current_step)
        kicked.append(run.id)
    return kicked


def heartbeat(rt: Runtime, queues: list[str], member: str) -> None:
    pipe = rt.redis.pipeline(transaction=False)
    now = time.time()
    for queue in queues:
        pipe.zadd(keys.workers(queue), {member: now})
        pipe.zremrangebyscore(keys.workers(queue), "-inf", now - 3600)
    pipe.execute()


def live_workers(rt: Runtime, queue: str, within_s: float = 45) -> int:
    return int(rt.redis.zcount(keys.workers(queue), time.time() - within_s, "+inf"))


def start_reaper(rt: Runtime, send_step: Callable[[str, int], None], queues: list[str]) -> threading.Thread:
    member = f"{socket.gethostname()}:{os.getpid()}"

    def loop() -> None:
        while True:
            try:
                heartbeat(rt, queues, member)
                reap_once(rt, send_step)
            except Exception:  # Redis restarting: try again next round
                log.exception("reaper pass failed")
            time.sleep(rt.settings.reaper_interval_s)

    thread = threading.Thread(target=loop, name="reactq-reaper", daemon=True)
    thread.start()
    return thread
