"""The Redis state store: run records, step traces, stored LLM replies and tool results, events,
batches and per-tenant usage. Every change to a run record goes through one fenced transaction."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from . import keys
from .core.models import LLMReply, Observation, Run, RunStatus, Step, Usage
from .errors import StoreUnavailable

EVENTS_MAXLEN = 2000
# A step message's run id, from Celery's `argsrepr` header ("['RUN_ID', INDEX]") in the raw message JSON.
_STEP_ARGS = re.compile(rb'"argsrepr": "\[\'([0-9a-f]{32})\', \d+\]"')

_RENEW_LEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
)


def connect(url: str, max_connections: int = 64) -> redis.Redis:
    """A client whose pool holds `max_connections` (blocking, not raising, when all are busy) and which
    retries through a Redis restart."""
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=30, health_check_interval=30,
        socket_connect_timeout=5, socket_keepalive=True,
        # ~30 s of retries: long enough to ride out a Redis restart
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=20,
                    supported_errors=(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )
    return redis.Redis(connection_pool=pool)


def ping(client: redis.Redis, url: str) -> None:
    """Patient: rides the client's retries (a worker starting while Redis restarts)."""
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise StoreUnavailable(url, exc) from None


QUICK_TIMEOUT_S = 2.0


def ping_quickly(url: str, timeout_s: float = QUICK_TIMEOUT_S) -> None:
    """Impatient: one attempt with short timeouts, for a person waiting at a prompt.

    The store's own client retries for ~30 s to ride out a restart, which is right for a daemon and
    wrong for `reactq status`: an unreachable Redis must be reported within seconds."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                                  retry=Retry(NoBackoff(), 0), retry_on_error=[])
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise StoreUnavailable(url, exc) from None
    finally:
        client.close()


class RunStore:
    def __init__(self, client: redis.Redis, record_ttl_s: int = 7 * 24 * 3600) -> None:
        self.r = client
        self.ttl = record_ttl_s

    # --- run records -------------------------------------------------------------------------
    def create_runs(self, runs: Iterable[Run], batch_id: str | None = None) -> None:
        pipe = self.r.pipeline(transaction=False)
        now = time.time()
        for run in runs:
            pipe.set(keys.run(run.id), run.model_dump_json())
            pipe.zadd(keys.ACTIVE_RUNS, {run.id: now})
            pipe.xadd(keys.events(run.id), {"type": "queued", "data": "{}"}, maxlen=EVENTS_MAXLEN)
            if batch_id:
                pipe.rpush(keys.batch_runs(batch_id), run.id)
        pipe.execute()

    def load_run(self, run_id: str) -> Run | None:
        raw = self.r.get(keys.run(run_id))
        return Run.model_validate_json(raw) if raw else None

    def load_runs(self, run_ids: list[str]) -> list[Run | None]:
        if not run_ids:
            return []
        raws = self.r.mget([keys.run(i) for i in run_ids])
        return [Run.model_validate_json(r) if r else None for r in raws]

    def lease_and_load(
        self, run_id: str, index: int, token: str, ttl_ms: int
    ) -> tuple[bool, Run | None, list[Step], LLMReply | None]:
        """Try to take the run's lease and read the run, its steps and the stored reply of step `index`,
        in one round trip. Reads are meaningful only with the lease: no holder writes behind them."""
        pipe = self.r.pipeline(transaction=False)
        pipe.set(keys.lease(run_id), token, nx=True, px=ttl_ms)
        pipe.get(keys.run(run_id))
        pipe.lrange(keys.steps(run_id), 0, -1)
        pipe.get(keys.reply(run_id, index))
        pipe.set(keys.step_taken(run_id), f"{index}:{time.time():.3f}", ex=self.ttl)  # for the reaper
        acquired, raw_run, raw_steps, raw_reply, _ = pipe.execute()
        run = Run.model_validate_json(raw_run) if raw_run else None
        if not acquired or run is None or run.status.finished or run.current_step != index:
            return bool(acquired), run, [], None
        steps = [Step.model_validate_json(s) for s in raw_steps]
        return True, run, steps, LLMReply.model_validate_json(raw_reply) if raw_reply else None

    def load_steps(self, run_id: str) -> list[Step]:
        return [Step.model_validate_json(s) for s in self.r.lrange(keys.steps(run_id), 0, -1)]

    def update_run(
        self,
        run_id: str,
        mutate: Callable[[Run], bool],
        extra: Callable[[Any, Run], None] | None = None,
    ) -> Run | None:
        """Apply `mutate` to the run record atomically (optimistic WATCH). `mutate` returns False to
        leave the record alone (the fence said no); then None is returned. `extra` adds commands to
        the same transaction."""
        key = keys.run(run_id)
        with self.r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        pipe.unwatch()
                        return None
                    run = Run.model_validate_json(raw)
                    was_finished = run.status.finished
                    if not mutate(run):
                        pipe.unwatch()
                        return None
                    run.updated_at = time.time()
                    pipe.multi()
                    pipe.set(key, run.model_dump_json(), keepttl=True)
                    if extra is not None:
                        extra(pipe, run)
                    if run.status.finished and not was_finished:
                        self._on_finished(pipe, run)
                    elif not run.status.finished:
                        pipe.zadd(keys.ACTIVE_RUNS, {run.id: run.updated_at})
                    pipe.execute()
                    return run
                except redis.WatchError:
                    continue

    def _on_finished(self, pipe: Any, run: Run) -> None:
        pipe.zrem(keys.ACTIVE_RUNS, run.id)
        pipe.xadd(
            keys.events(run.id),
            {"type": "finished", "data": json.dumps({"status": run.status.value, "answer": run.answer})},
            maxlen=EVENTS_MAXLEN,
        )
        for key in (keys.run(run.id), keys.steps(run.id), keys.events(run.id)):
            pipe.expire(key, self.ttl)
        if run.spec.batch_id:
            pipe.rpush(keys.batch_done(run.spec.batch_id), run.id)

    def commit_step(
        self, run_id: str, step: Step, apply: Callable[[Run], None]
    ) -> Run | None:
        """Record step `step.index` and advance the run, only if the run is still at that step."""

        def mutate(run: Run) -> bool:
            if run.status.finished or run.current_step != step.index:
                return False
            run.current_step = step.index + 1
            run.usage = run.usage + step.usage
            run.cost_usd += step.cost_usd
            run.waiting_on = None
            apply(run)
            return True

        def extra(pipe: Any, run: Run) -> None:
            pipe.rpush(keys.steps(run_id), step.model_dump_json())
            pipe.xadd(keys.events(run_id), {"type": "step", "data": step.model_dump_json()}, maxlen=EVENTS_MAXLEN)
            self._count_usage(pipe, run, step.usage, step.cost_usd)

        return self.update_run(run_id, mutate, extra)

    def _count_usage(self, pipe: Any, run: Run, usage: Usage, cost: float) -> None:
        targets = [keys.tenant_usage(run.spec.tenant)]
        if run.spec.batch_id:
            targets.append(keys.batch(run.spec.batch_id))
        for key in targets:
            pipe.hincrby(key, "prompt_tokens", usage.prompt_tokens)
            pipe.hincrby(key, "completion_tokens", usage.completion_tokens)
            pipe.hincrbyfloat(key, "cost_usd", cost)

    def finish(self, run_id: str, status: RunStatus, reason: str, *, only_step: int | None = None) -> Run | None:
        """End a run without recording a step (a limit, an LLM failure, a cancel)."""

        def mutate(run: Run) -> bool:
            if run.status.finished or (only_step is not None and run.current_step != only_step):
                return False
            run.status = status
            run.error = reason or None
            run.finished_at = time.time()
            return True

        return self.update_run(run_id, mutate)

    def mark_running(self, run_id: str, step_index: int, waiting_on: str | None = None) -> Run | None:
        """Running (and, on its first step, its deadline clock started), or waiting on something."""

        def mutate(run: Run) -> bool:
            if run.status.finished or run.current_step != step_index:
                return False
            if run.deadline_at is None and run.deadline_s is not None:
                run.deadline_at = time.time() + run.deadline_s
            run.status = RunStatus.RUNNING
            run.waiting_on = waiting_on
            return True

        return self.update_run(run_id, mutate)

    # --- idempotency: stored replies, tool results, dispatch markers, leases ------------------
    def get_reply(self, run_id: str, step: int) -> LLMReply | None:
        raw = self.r.get(keys.reply(run_id, step))
        return LLMReply.model_validate_json(raw) if raw else None

    def save_reply(self, run_id: str, step: int, reply: LLMReply) -> LLMReply:
        """Store the reply unless one is there already; return the one that counts."""
        key = keys.reply(run_id, step)
        if self.r.set(key, reply.model_dump_json(), nx=True, ex=self.ttl):
            return reply
        stored = self.get_reply(run_id, step)
        return stored or reply

    def get_tool_result(self, run_id: str, step: int, call_id: str) -> Observation | None:
        raw = self.r.get(keys.tool_result(run_id, step, call_id))
        return Observation.model_validate_json(raw) if raw else None

    def save_tool_result(self, run_id: str, step: int, obs: Observation) -> Observation:
        key = keys.tool_result(run_id, step, obs.call_id)
        if self.r.set(key, obs.model_dump_json(), nx=True, ex=self.ttl):
            return obs
        return self.get_tool_result(run_id, step, obs.call_id) or obs

    def get_sandbox_result(self, run_id: str, step: int, call_id: str) -> bytes | None:
        """The sandbox worker's raw result object for one call, once it has stored it."""
        return self.r.get(keys.sandbox_result(run_id, step, call_id))

    def claim_dispatch(self, run_id: str, step: int, call_id: str, ttl_s: int) -> bool:
        return bool(self.r.set(keys.sandbox_dispatch(run_id, step, call_id), "1", nx=True, ex=ttl_s))

    def renew_leases(self, held: list[tuple[str, str]], ttl_ms: int) -> None:
        pipe = self.r.pipeline(transaction=False)
        for run_id, token in held:
            pipe.eval(_RENEW_LEASE, 1, keys.lease(run_id), token, ttl_ms)
        pipe.execute()

    def release_lease(self, run_id: str, token: str) -> None:
        # delete only our own lease
        self.r.eval(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0",
            1, keys.lease(run_id), token,
        )

    def lease_held(self, run_id: str) -> bool:
        return bool(self.r.exists(keys.lease(run_id)))

    # --- idempotent-tool cache ------------------------------------------------------------------
    @staticmethod
    def _digest(arguments: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:32]

    def cached_tool_result(self, tool: str, arguments: dict[str, Any]) -> str | None:
        raw = self.r.get(keys.tool_cache(tool, self._digest(arguments)))
        return raw.decode() if raw else None

    def cache_tool_result(self, tool: str, arguments: dict[str, Any], content: str, ttl_s: int) -> None:
        if ttl_s > 0:
            self.r.set(keys.tool_cache(tool, self._digest(arguments)), content, ex=ttl_s)

    # --- batches, usage, reaper ----------------------------------------------------------------
    def create_batch(self, batch_id: str, meta: dict[str, str]) -> None:
        self.r.hset(keys.batch(batch_id), mapping={"created_at": str(time.time()), **meta})

    def batch_run_ids(self, batch_id: str) -> list[str]:
        return [i.decode() for i in self.r.lrange(keys.batch_runs(batch_id), 0, -1)]

    def batch_finished_since(self, batch_id: str, start: int) -> list[str]:
        return [i.decode() for i in self.r.lrange(keys.batch_done(batch_id), start, -1)]

    def batch_finished_count(self, batch_id: str) -> int:
        return int(self.r.llen(keys.batch_done(batch_id)))

    def batch_info(self, batch_id: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(keys.batch(batch_id)).items()}

    def tenant_usage(self, tenant: str) -> dict[str, float]:
        return {k.decode(): float(v) for k, v in self.r.hgetall(keys.tenant_usage(tenant)).items()}

    def stale_runs(self, older_than: float, limit: int = 500) -> list[str]:
        ids = self.r.zrangebyscore(keys.ACTIVE_RUNS, "-inf", older_than, start=0, num=limit)
        return [i.decode() for i in ids]

    def stale_runs_scored(self, older_than: float, limit: int = 500) -> list[tuple[str, float]]:
        """Active runs with no progress since `older_than`, with their last progress time."""
        found = self.r.zrangebyscore(keys.ACTIVE_RUNS, "-inf", older_than, start=0, num=limit, withscores=True)
        return [(i.decode(), float(score)) for i, score in found]

    def taken_marks(self, run_ids: list[str]) -> list[tuple[int, float] | None]:
        """For each run, the last step index a worker received and when (None: never)."""
        marks: list[tuple[int, float] | None] = []
        for raw in self.r.mget([keys.step_taken(r) for r in run_ids]) if run_ids else []:
            index, _, at = raw.decode().partition(":") if raw else ("", "", "")
            marks.append((int(index), float(at)) if at else None)
        return marks

    def leases_held(self, run_ids: list[str]) -> list[bool]:
        pipe = self.r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.exists(keys.lease(run_id))
        return [bool(n) for n in pipe.execute()]

    def queued_step_runs(self, lists: list[str], scan_limit: int) -> set[str] | None:
        """Run ids with a step message waiting in `lists` or taken and not acked (kombu's `unacked`
        hash); None when there are more than `scan_limit` messages to look through."""
        pipe = self.r.pipeline(transaction=False)
        for name in lists:
            pipe.llen(name)
        pipe.hlen(keys.CELERY_UNACKED)
        if sum(pipe.execute()) > scan_limit:
            return None
        found: set[str] = set()
        for name in lists:
            for start in range(0, scan_limit, 1000):
                chunk = self.r.lrange(name, start, start + 999)
                found.update(m.decode() for m in _STEP_ARGS.findall(b"\n".join(chunk)))
                if len(chunk) < 1000:
                    break
        for _, raw in self.r.hscan_iter(keys.CELERY_UNACKED, count=1000):
            found.update(m.decode() for m in _STEP_ARGS.findall(raw))
        return found

    def suspect_again(self, run_id: str, step: int, ttl_s: int) -> bool:
        """Record that the reaper found no message for this step; True if it had already found none."""
        return self.r.set(keys.reaper_suspect(run_id), step, ex=ttl_s, get=True) == str(step).encode()

    def touch_active(self, run_id: str) -> None:
        self.r.zadd(keys.ACTIVE_RUNS, {run_id: time.time()}, xx=True)

    def active_count(self) -> int:
        return int(self.r.zcard(keys.ACTIVE_RUNS))
