"""The cluster's own Redis state, beside the runs' (worker/store/runs.py): worker heartbeats, the reaper's
lock, queue depths, and the reaper's scans of active runs and of the broker's queued and unacked step
messages. The reaper and `reactq demo` reach Redis only through here."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Iterable
from datetime import datetime

import redis

from ..names import QUEUES, queue_lists
from . import keys
from .connection import mget

# A step message's run id, from Celery's `argsrepr` header ("['RUN_ID', INDEX]") in the raw message JSON.
_STEP_ARGS = re.compile(rb'"argsrepr": "\[\'([0-9a-f]{32})\', \d+\]"')
_ETA = re.compile(rb'"eta": "([^"]+)"')
# A sandbox message's run id, from the result key in its body (its argsrepr may be cut short by long code).
_SANDBOX_RUN = re.compile(rb"reactq:run:\{?([0-9a-f]{3})\}?([0-9a-f]{29}):sandbox:")  # keys.run_tag


class ClusterStore:
    """`client`: the state Redis; `broker`: the Celery broker's Redis (its lists and kombu's unacked hash), the
    same client unless REACTQ_BROKER_URL names another server."""

    def __init__(self, client: redis.Redis, broker: redis.Redis | None = None) -> None:
        self.r = client
        self.broker = broker if broker is not None else client

    def heartbeat(self, queues: list[str], member: str, forget_after_s: float = 3600) -> None:
        """Say that worker `member` consumes `queues` now (and forget members silent for an hour)."""
        pipe = self.r.pipeline(transaction=False)
        now = time.time()
        for queue in queues:
            pipe.zadd(keys.workers(queue), {member: now})
            pipe.zremrangebyscore(keys.workers(queue), "-inf", now - forget_after_s)
        pipe.execute()

    def live_workers(self, queue: str, within_s: float = 45) -> int:
        return int(self.r.zcount(keys.workers(queue), time.time() - within_s, "+inf"))

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each reactq queue (the broker's lists: one per priority, worker/tenancy/fairness.py)."""
        pipe = self.broker.pipeline(transaction=False)
        for queue in QUEUES:
            for name in queue_lists(queue):
                pipe.llen(name)
        counts = iter(pipe.execute())
        return {queue: sum(next(counts) for _ in queue_lists(queue)) for queue in QUEUES}

    def take_reaper_turn(self, interval_s: float) -> bool:
        """True for at most one caller in the cluster per interval."""
        return bool(self.r.set(keys.REAPER_LOCK, "1", nx=True, ex=max(1, int(interval_s))))

    # --- the reaper's scans of active runs ---------------------------------------------------
    def stale_runs_scored(self, older_than: float, limit: int = 500) -> list[tuple[str, float]]:
        """Active runs with no progress since `older_than`, with their last progress time (the `limit`
        oldest; on a cluster, the few oldest of every active set, in one pipeline per node: runs hash evenly
        over the sets, and the next pass takes the next few)."""
        sets = keys.active_sets()
        per_set = min(limit, max(4, 4 * limit // len(sets)))
        pipe = self.r.pipeline(transaction=False)
        for active in sets:
            pipe.zrangebyscore(active, "-inf", older_than, start=0, num=per_set, withscores=True)
        found = sorted(((i.decode(), float(score)) for got in pipe.execute() for i, score in got),
                       key=lambda pair: pair[1])
        return found[:limit]

    def taken_marks(self, run_ids: list[str]) -> list[tuple[int, float] | None]:
        """For each run, the last step index a worker received and when (None: never)."""
        marks: list[tuple[int, float] | None] = []
        for raw in mget(self.r, [keys.step_taken(r) for r in run_ids]):
            index, _, at = raw.decode().partition(":") if raw else ("", "", "")
            marks.append((int(index), float(at)) if at else None)
        return marks

    def leases_held(self, run_ids: list[str]) -> list[bool]:
        pipe = self.r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.exists(keys.lease(run_id))
        return [bool(n) for n in pipe.execute()]

    def queued_step_runs(self, lists: list[str], scan_limit: int, lost_before: float) -> set[str] | None:
        """Run ids with a step message waiting in `lists` or held by a worker (kombu's `unacked` hash);
        None when there are more than `scan_limit` messages to look through.

        A message taken before `lost_before` whose countdown (if any) was also due by then is not held:
        a step starts as soon as it is taken and due, and a worker whose connection broke while it was
        taking one (a Redis restart) never gets it; kombu would restore it only after its visibility
        timeout. The reaper re-kicks such a run instead (a duplicate of a message that did exist costs
        one fenced task)."""
        return self._queued_runs(lists, scan_limit, lost_before, _step_runs)

    def queued_sandbox_runs(self, lists: list[str], scan_limit: int, lost_before: float) -> set[str] | None:
        """The same for sandbox messages (their run id is in the body's result key: the argsrepr may be cut
        short by long code). A sandbox task marks its call pending as it starts, so a message taken before
        `lost_before` and never started is not held either: with Redis's writes of its last second lost,
        the `unacked` hash can even hold again a message whose task has run (its ack was lost)."""
        return self._queued_runs(lists, scan_limit, lost_before, _sandbox_runs)

    def _queued_runs(self, lists: list[str], scan_limit: int, lost_before: float,
                     runs_in: Callable[[list[bytes]], Iterable[str]]) -> set[str] | None:
        pipe = self.broker.pipeline(transaction=False)
        for name in lists:
            pipe.llen(name)
        pipe.hlen(keys.CELERY_UNACKED)
        if sum(pipe.execute()) > scan_limit:
            return None
        found: set[str] = set()
        for name in lists:
            for start in range(0, scan_limit, 1000):
                chunk = self.broker.lrange(name, start, start + 999)
                found.update(runs_in(chunk))
                if len(chunk) < 1000:
                    break
        taken_at = dict(self.broker.zrange(keys.CELERY_UNACKED_INDEX, 0, -1, withscores=True))
        for tag, raw in self.broker.hscan_iter(keys.CELERY_UNACKED, count=1000):
            if _still_held(raw, taken_at.get(tag), lost_before):
                found.update(runs_in([raw]))
        return found

    def suspect_again(self, run_id: str, step: int, ttl_s: int) -> bool:
        """Record that the reaper found no message for this step; True if it had already found none."""
        return self.r.set(keys.reaper_suspect(run_id), step, ex=ttl_s, get=True) == str(step).encode()

    def touch_active(self, run_id: str) -> None:
        self.r.zadd(keys.active_runs(run_id), {run_id: time.time()}, xx=True)

    def forget_active(self, run_id: str) -> None:
        self.r.zrem(keys.active_runs(run_id), run_id)

    def look_again_at(self, run_id: str, when: float) -> None:
        """Have the reaper look at an active run again at `when` (a run that waits for a person)."""
        self.r.zadd(keys.active_runs(run_id), {run_id: when}, xx=True)

    def active_count(self) -> int:
        """Runs in the active set; on a cluster, as the last reaper pass counted them (count_active)."""
        if not keys.hash_tags():
            return int(self.r.zcard(keys.ACTIVE_RUNS))
        return int(self.r.get(keys.ACTIVE_COUNT) or 0)

    def count_active(self, keep_s: float) -> int:
        """Count the runs in the active sets now (the reaper's pass) and, on a cluster, keep the count for
        `active_count` for `keep_s`."""
        if not keys.hash_tags():
            return self.active_count()
        count = active_count(self.r)
        self.r.set(keys.ACTIVE_COUNT, count, ex=max(1, int(keep_s)))
        return count


def active_count(client: redis.Redis) -> int:
    """Runs in the active sets (on a cluster, their 4,096 ZCARDs in one pipeline per node)."""
    pipe = client.pipeline(transaction=False)
    for active in keys.active_sets():
        pipe.zcard(active)
    return sum(int(n) for n in pipe.execute())


def _still_held(raw: bytes, taken_at: float | None, lost_before: float) -> bool:
    """Whether an unacked message (taken at `taken_at`) may still be with a worker at `lost_before`."""
    if taken_at is None or taken_at >= lost_before:
        return True
    eta = _ETA.search(raw)
    if eta is None:
        return False
    try:
        return datetime.fromisoformat(eta.group(1).decode()).timestamp() >= lost_before
    except ValueError:
        return True  # an ETA we cannot read: leave the message to the broker


def _step_runs(raws: list[bytes]) -> list[str]:
    return [m.decode() for m in _STEP_ARGS.findall(b"\n".join(raws))]


def _sandbox_runs(raws: list[bytes]) -> list[str]:
    return [run_id for run_id in map(_sandbox_run, raws) if run_id]


def _sandbox_run(raw: bytes) -> str:
    """The run id in a raw message's (base64) body, or "": a queued message is kombu's JSON envelope, an
    unacked one the list [envelope, exchange, routing key]."""
    try:
        message = json.loads(raw)
        if isinstance(message, list):
            message = message[0]
        body = message["body"]
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        found = _SANDBOX_RUN.search(body if isinstance(body, bytes) else str(body).encode())
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    return (found[1] + found[2]).decode() if found else ""
