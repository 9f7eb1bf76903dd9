"""Finds runs that stopped moving and re-enqueues their step, whatever the queues hold.

A run is stranded when nobody holds its lease (a working step renews it every few seconds) and nothing
will deliver its step. The reaper tells the cases apart by what the run left behind, never by whether
the queues are empty, so a stranded run is back in the queue within about a minute even while a
backlog of thousands waits:

- `dead_worker`: a worker received the current step (the `taken` mark, written when a delivery reads
  the run) after the run's last progress, and its lease has lapsed for longer than two lease TTLs. The
  broker would hand the message back only after its visibility timeout (an hour).
- `lost_message`: no worker received the step since the last progress, the run has been idle for
  `REACTQ_STALE_AFTER_S`, and no message for it is waiting in the steps queue (every priority list) or
  held unacked — in two passes in a row (a message a worker is just taking is briefly in neither place;
  the first miss only marks the run a suspect). A message taken unacked longer than
  `REACTQ_STALE_AFTER_S` ago, with no countdown still ahead, and not started is not held: its worker's
  connection broke while taking it (a Redis restart), and the broker would restore it only after its
  visibility timeout. Looking costs one scan of the queue per pass, done only
  when such a candidate exists and only while the queue holds at most `REACTQ_REAPER_SCAN_LIMIT`
  messages; beyond that ...
- `long_stale`: ... a run idle for longer than the broker's visibility timeout is re-kicked anyway.
- `sandbox_lost`: a run `waiting_on=sandbox` whose step's pending marker (`keys.sandbox_pending`, kept
  alive by a sandbox task while its call waits in line for a slot or runs) has expired, idle for longer
  than `REACTQ_SANDBOX_REDISPATCH_AFTER_S`, or for longer than `REACTQ_STALE_AFTER_S` with no message for
  it in the sandbox queue or held unacked in two passes in a row (as for `lost_message`; Redis that lost
  its last second of writes can lose the message, the result and the next step's message): no task will
  write the result, so the step's dispatch marks are dropped and its re-run sends the sandboxed call
  again, or uses the result stored meanwhile. A call legitimately waiting in line, however long, is left
  alone: its task ends it with a result; so is a run whose step message waits in the steps queue (the
  sandbox result's continuation, queued with the run's priority behind a backlog).
- `sandbox_deadline`: the same, but the run's deadline has passed: the run ends (`timeout`, with the
  reason that its deadline passed while it waited for a sandbox result) instead of sending the call again.
- `sandbox_unavailable`: a run `waiting_on=sandbox` whose pending marker has expired, idle for
  `REACTQ_SANDBOX_UNAVAILABLE_S`, while no sandbox worker with a working backend was seen for as long (a
  worker whose backend is down stops heartbeating the sandbox queue, and stops consuming it): the run ends
  `failed` (`sandbox_unavailable`). Checked before `sandbox_lost`, whose re-send would restart the idle
  clock: with the defaults (both 300 s) such a run ends at 300 s; with REACTQ_SANDBOX_UNAVAILABLE_S above
  REACTQ_SANDBOX_REDISPATCH_AFTER_S it is re-sent instead, and ends at its deadline. A call that a
  sandbox worker took ends through its own result instead (tools_sandbox/edges/sandbox_worker.py).
- `dropped`: a finished or vanished run left in the active set is removed from it.
A run `waiting_on=provider` (its model call failed for now; the step went back to the queue with a countdown)
is never `dead_worker`: it is re-kicked only as `lost_message` or `long_stale`, when its message is gone.

A re-kick is always safe: a step is fenced on the step number and takes the run's lease, so a duplicate
of a message that did exist costs one cheap fenced task. Each action is counted in
`reactq_reaper_actions_total{action}`. One reaper in the cluster works at a time (a Redis lock); every
worker also samples the queue depths for the gauges.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from enum import StrEnum

from tools_sandbox.base.render import UNAVAILABLE_TEXT

from .. import metrics
from ..core.models import Run, RunStatus
from ..names import SANDBOX_QUEUE, STEPS_QUEUE, queue_lists
from ..store.ops import OpsStore
from .approvals import expire_or_defer
from .context import Runtime
from .ops_snapshot import Publisher
from .runner import Dispatcher, record_finished

log = logging.getLogger("reactq.reaper")

SANDBOX_DEADLINE_REASON = "run deadline passed while waiting for a sandbox result (no sandbox task was answering)"


class ReaperAction(StrEnum):
    DEAD_WORKER = "dead_worker"
    LOST_MESSAGE = "lost_message"
    LONG_STALE = "long_stale"
    SANDBOX_LOST = "sandbox_lost"
    SANDBOX_DEADLINE = "sandbox_deadline"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    DROPPED = "dropped"


def _decide(run: Run, progress_at: float, taken: tuple[int, float] | None, now: float, rt: Runtime,
            queued: Callable[[], set[str] | None],
            sandbox_queued: Callable[[], set[str] | None]) -> ReaperAction | None:
    s = rt.settings
    idle = now - progress_at
    if run.waiting_on == "sandbox":
        if idle <= s.stale_after_s or rt.store.scratch.sandbox_pending(run.id, run.current_step):
            return None
        if (stepping := queued()) is not None and run.id in stepping:  # its continuation waits its turn
            return None
        past_deadline = run.deadline_at is not None and now >= run.deadline_at
        if not past_deadline and idle > s.sandbox_unavailable_s and rt.cluster.live_workers(
                SANDBOX_QUEUE, within_s=s.sandbox_unavailable_s) == 0:  # no sandbox worker could take it
            return ReaperAction.SANDBOX_UNAVAILABLE
        if idle <= s.sandbox_redispatch_after_s:  # sooner when no sandbox message for it is left anywhere
            waiting = sandbox_queued()
            if waiting is None or run.id in waiting or not rt.cluster.suspect_again(
                    run.id, run.current_step, ttl_s=int(4 * s.reaper_interval_s) + 5):
                return None
        if past_deadline:
            return ReaperAction.SANDBOX_DEADLINE
        return ReaperAction.SANDBOX_LOST
    # A run waiting on its model's provider took its step and sent it again with a countdown: its taken mark
    # says nothing of a dead worker, and its message is held (as a countdown) or queued, like any other's.
    if (run.waiting_on != "provider" and taken is not None and taken[0] == run.current_step
            and taken[1] >= progress_at - 1):
        return ReaperAction.DEAD_WORKER if now - taken[1] > 2 * s.lease_ttl_s else None
    if idle > s.visibility_timeout_s:
        return ReaperAction.LONG_STALE
    if idle > s.stale_after_s:
        waiting = queued()
        if waiting is not None and run.id not in waiting and rt.cluster.suspect_again(
                run.id, run.current_step, ttl_s=int(4 * s.reaper_interval_s) + 5):
            return ReaperAction.LOST_MESSAGE
    return None


def reap_once(rt: Runtime, dispatch: Dispatcher, now: float | None = None) -> list[str]:
    """One pass; returns the ids of the runs re-kicked."""
    now = now or time.time()
    s = rt.settings
    depths = rt.cluster.queue_depths()
    for queue, depth in depths.items():
        metrics.QUEUE_DEPTH.labels(queue).set(depth)
    if not rt.cluster.take_reaper_turn(s.reaper_interval_s):
        metrics.RUNS_IN_PROGRESS.set(rt.cluster.active_count())
        return []
    metrics.RUNS_IN_PROGRESS.set(rt.cluster.count_active(3 * s.reaper_interval_s))
    candidates = rt.cluster.stale_runs_scored(now - min(2 * s.lease_ttl_s, s.stale_after_s))
    if not candidates:
        return []
    ids = [run_id for run_id, _ in candidates]
    runs, taken, leased = rt.store.load_runs(ids), rt.cluster.taken_marks(ids), rt.cluster.leases_held(ids)
    scanned: dict[str, set[str] | None] = {}

    def queued() -> set[str] | None:  # one scan per pass, and only if some run needs it
        if STEPS_QUEUE not in scanned:
            scanned[STEPS_QUEUE] = rt.cluster.queued_step_runs(queue_lists(STEPS_QUEUE), s.reaper_scan_limit,
                                                               lost_before=now - s.stale_after_s)
        return scanned[STEPS_QUEUE]

    def sandbox_queued() -> set[str] | None:
        if SANDBOX_QUEUE not in scanned:
            scanned[SANDBOX_QUEUE] = rt.cluster.queued_sandbox_runs(
                queue_lists(SANDBOX_QUEUE), s.reaper_scan_limit, lost_before=now - s.stale_after_s)
        return scanned[SANDBOX_QUEUE]

    kicked = []
    for (run_id, progress_at), run, mark, held in zip(candidates, runs, taken, leased, strict=True):
        if rt.store.on_cluster and run is not None and not held:
            rt.store.outbox.drain(run_id)  # what a writer that died did not apply on other shards (store/outbox.py)
        if run is None or run.status.finished:  # a missing record (expired, or lost with Redis data) too
            rt.cluster.forget_active(run_id)
            metrics.REAPER_ACTIONS.labels(ReaperAction.DROPPED).inc()
            continue
        if run.status == RunStatus.AWAITING_APPROVAL:  # nothing to re-kick: a person's decision moves it
            if (ended := expire_or_defer(rt, run, now)) is not None:
                record_finished(ended, rt, dispatch.webhook)
            continue
        if held:
            continue
        action = _decide(run, progress_at, mark, now, rt, queued, sandbox_queued)
        if action is None:
            continue
        if action in (ReaperAction.SANDBOX_DEADLINE, ReaperAction.SANDBOX_UNAVAILABLE):
            status, reason = ((RunStatus.TIMEOUT, SANDBOX_DEADLINE_REASON) if action is ReaperAction.SANDBOX_DEADLINE
                              else (RunStatus.FAILED, UNAVAILABLE_TEXT))
            log.warning("ending a run that waited for a sandbox result no sandbox worker gave",
                        extra={"run_id": run.id, "step": run.current_step, "action": action.value})
            if (ended := rt.store.finish(run.id, status, reason, only_step=run.current_step)) is not None:
                record_finished(ended, rt, dispatch.webhook)
                metrics.REAPER_ACTIONS.labels(action).inc()
                OpsStore(rt.redis).note_reaper_action(run.id, run.current_step, action.value)
            continue
        log.warning("re-kicking stranded run", extra={"run_id": run.id, "step": run.current_step,
                                                      "action": action.value})
        if action is ReaperAction.SANDBOX_LOST and (reply := rt.store.scratch.get_reply(run.id, run.current_step)):
            rt.store.claims.release_dispatch(run.id, run.current_step, [call.id for call in reply.tool_calls])
        rt.cluster.touch_active(run.id)
        dispatch.next_step(run.id, run.current_step)
        metrics.REAPER_ACTIONS.labels(action).inc()
        OpsStore(rt.redis).note_reaper_action(run.id, run.current_step, action.value)
        kicked.append(run.id)
    return kicked


def start_reaper(rt: Runtime, dispatch: Dispatcher, queues: list[str]) -> threading.Thread:
    """Heartbeat for `queues`; step workers also reap (sandbox workers may hold a Redis user that cannot
    read run records: deploy/redis/acl.conf)."""
    member = f"{socket.gethostname()}:{os.getpid()}"
    reap = STEPS_QUEUE in queues

    def serving() -> list[str]:
        """The queues this worker serves now: the sandbox queue only while its backend can run code."""
        if SANDBOX_QUEUE not in queues:
            return queues
        from tools_sandbox import backend_up

        return queues if backend_up() else [q for q in queues if q != SANDBOX_QUEUE]

    # the operations page's figures of this process (worker/runtime/ops_snapshot.py)
    snapshots = Publisher(OpsStore(rt.redis), member, ttl_s=3 * rt.settings.reaper_interval_s + 5)

    def loop() -> None:
        while True:
            try:
                queues_now = serving()
                rt.cluster.heartbeat(queues_now, member)
                if reap:
                    reap_once(rt, dispatch)
                snapshots.publish(queues_now)  # last: the page's figures never hold up a reaper pass
            except Exception:  # Redis restarting: try again next round
                log.exception("reaper pass failed")
            time.sleep(rt.settings.reaper_interval_s)

    thread = threading.Thread(target=loop, name="reactq-reaper", daemon=True)
    thread.start()
    return thread
