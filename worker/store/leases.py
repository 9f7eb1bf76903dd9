"""Step leases: the key that lets one delivery of a run's step work on it at a time. Taking one reads what
the step needs with it, in the same round trip; a background thread renews the ones a worker holds
(worker/runtime/leases.py); a step's commit lets go of its lease in its own transaction (runs.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from ..core.models import LLMReply, Observation, Run, Step
from . import keys
from .cas import RELEASE_LEASE, Snapshot
from .runs import decode_steps
from .scripts import lua

_RENEW_LEASE = lua(__file__, "renew_lease.lua")


@dataclass(frozen=True)
class Loaded:
    """What one delivery of step `index` reads, in one round trip, as it tries to take the run's lease.
    Beyond the run record, it is meaningful only with the lease (no holder writes behind it)."""

    acquired: bool
    snapshot: Snapshot | None  # None: no such run
    steps: list[Step]
    reply: LLMReply | None  # the reply stored for this step by an earlier delivery
    results: dict[str, Observation]  # tool results stored for this step, by call id

    @property
    def run(self) -> Run | None:
        return self.snapshot.run if self.snapshot is not None else None


class Leases:
    def __init__(self, client: redis.Redis, run_ttl_s: int) -> None:
        self.r = client
        self.run_ttl = run_ttl_s  # the reaper's taken marker lives as long as an unfinished run's keys

    def lease_and_load(self, run_id: str, index: int, token: str, ttl_ms: int) -> Loaded:
        """Try to take the run's lease and read the run, its steps, and the reply and tool results
        stored for step `index` (scratch.py), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.set(keys.lease(run_id), token, nx=True, px=ttl_ms)
        pipe.get(keys.run(run_id))
        pipe.lrange(keys.steps(run_id), 0, -1)
        pipe.get(keys.reply(run_id, index))
        pipe.hgetall(keys.tool_results(run_id, index))
        pipe.set(keys.step_taken(run_id), f"{index}:{time.time():.3f}", ex=self.run_ttl)  # for the reaper
        acquired, raw_run, raw_steps, raw_reply, raw_results, _ = pipe.execute()
        snapshot = Snapshot(Run.model_validate_json(raw_run), raw_run) if raw_run else None
        run = snapshot.run if snapshot else None
        if not acquired or run is None or run.status.finished or run.current_step != index:
            return Loaded(bool(acquired), snapshot, [], None, {})
        return Loaded(
            True, snapshot, decode_steps(raw_steps),
            LLMReply.model_validate_json(raw_reply) if raw_reply else None,
            {k.decode(): Observation.model_validate_json(v) for k, v in raw_results.items()},
        )

    def renew(self, held: list[tuple[str, str]], ttl_ms: int) -> None:
        """Extend each (run id, token) lease that is still ours."""
        pipe = self.r.pipeline(transaction=False)
        for run_id, token in held:
            pipe.execute_command("EVAL", _RENEW_LEASE, 1, keys.lease(run_id), token, ttl_ms)  # a cluster's pipeline too
        pipe.execute()

    def release(self, run_id: str, token: str) -> None:
        self.r.eval(RELEASE_LEASE, 1, keys.lease(run_id), token)  # only our own lease
