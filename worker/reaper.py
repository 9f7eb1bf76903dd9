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

from . import metrics
from .approvals import expire_or_defer
from .core.models import RunStatus
from .names import STEPS_QUEUE
from .runner import record_finished
from .runtime import Runtime

log = logging.getLogger("reactq.reaper")


def reap_once(rt: Runtime, send_step: Callable[[str, int], None], now: float | None = None) -> list[str]:
    """One pass; returns the ids of the runs re-kicked."""
    now = now or time.time()
    s = rt.settings
    depths = rt.cluster.queue_depths()
    for queue, depth in depths.items():
        metrics.QUEUE_DEPTH.labels(queue).set(depth)
    metrics.RUNS_IN_PROGRESS.set(rt.store.active_count())
    if not rt.cluster.take_reaper_turn(s.reaper_interval_s):
        return []
    queues_empty = not any(depths.values())
    candidates = rt.store.stale_runs(now - s.stale_after_s)
    kicked = []
    for run_id, run in zip(candidates, rt.store.load_runs(candidates), strict=True):
        if run is None or run.status.finished:  # a missing record (expired, or lost with Redis data) too
            rt.store.forget_active(run_id)
            continue
        if run.status == RunStatus.AWAITING_APPROVAL:  # nothing to re-kick: a person's decision moves it
            if (ended := expire_or_defer(rt, run, now)) is not None:
                record_finished(ended, rt)
            continue
        long_stale = run.updated_at < now - s.visibility_timeout_s
        if rt.store.lease_held(run.id) or not (queues_empty or long_stale):
            continue
        log.warning("re-kicking stale run", extra={"run_id": run.id, "step": run.current_step})
        rt.store.touch_active(run.id)
        send_step(run.id, run.current_step)
        kicked.append(run.id)
    return kicked


def start_reaper(rt: Runtime, send_step: Callable[[str, int], None], queues: list[str]) -> threading.Thread:
    """Heartbeat for `queues`; step workers also reap (sandbox workers may hold a Redis user that cannot
    read run records: deploy/redis/acl.conf)."""
    member = f"{socket.gethostname()}:{os.getpid()}"
    reap = STEPS_QUEUE in queues

    def loop() -> None:
        while True:
            try:
                rt.cluster.heartbeat(queues, member)
                if reap:
                    reap_once(rt, send_step)
            except Exception:  # Redis restarting: try again next round
                log.exception("reaper pass failed")
            time.sleep(rt.settings.reaper_interval_s)

    thread = threading.Thread(target=loop, name="reactq-reaper", daemon=True)
    thread.start()
    return thread
