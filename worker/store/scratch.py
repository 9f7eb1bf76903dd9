"""A step's scratch: what a delivery of step n stores so that a later delivery of the same step takes it
up instead of doing it again (the LLM reply, each call's tool result), and what the sandbox worker
leaves for it (a call's result object, the step's pending marker). Working keys: they go when the run
finishes (run_keys.working_keys); the run's trace has it all by then. Each write keeps what is there
already: the first delivery's reply or result is the one that counts."""

from __future__ import annotations

from typing import Any

import redis

from ..core.models import LLMReply, Observation
from . import keys
from .cas import Command
from .tool_cache import entry_key


class StepScratch:
    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self.r = client
        self.ttl = ttl_s  # the run's working keys live as long as an unfinished run's

    def get_reply(self, run_id: str, step: int) -> LLMReply | None:
        raw = self.r.get(keys.reply(run_id, step))
        return LLMReply.model_validate_json(raw) if raw else None

    def prepare_act(
        self, run_id: str, step: int, reply: LLMReply | None, cacheable: list[tuple[str, dict[str, Any]]],
        also: list[Command] | None = None, *, tenant: str,
    ) -> tuple[bool, list[str | None]]:
        """Before a step acts, in one round trip: store its `reply` unless one is stored already (None:
        it came from the store), read `tenant`'s idempotent-tool cache (tool_cache.py) for the
        `cacheable` (tool, arguments) calls, and run the `also` writes. Returns whether our reply is the
        one that counts, and the cached contents."""
        pipe = self.r.pipeline(transaction=False)
        if reply is not None:
            pipe.set(keys.reply(run_id, step), reply.model_dump_json(), nx=True, ex=self.ttl)
        for tool, arguments in cacheable:
            pipe.get(entry_key(tenant, tool, arguments))
        for command in also or []:
            pipe.execute_command(*command)
        results = pipe.execute()[:len(cacheable) + (reply is not None)]
        stored = bool(results.pop(0)) if reply is not None else True
        return stored, [r.decode() if r else None for r in results]

    def save_tool_result(self, run_id: str, step: int, obs: Observation) -> Observation:
        """Store one call's result unless one is there already; return the one that counts."""
        key = keys.tool_results(run_id, step)
        pipe = self.r.pipeline(transaction=False)
        pipe.hsetnx(key, obs.call_id, obs.model_dump_json())
        pipe.expire(key, self.ttl)
        if pipe.execute()[0]:
            return obs
        stored = self.r.hget(key, obs.call_id)
        return Observation.model_validate_json(stored) if stored else obs

    def get_sandbox_result(self, run_id: str, step: int, call_id: str) -> bytes | None:
        """The sandbox worker's raw result object for one call, once it has stored it."""
        return self.r.get(keys.sandbox_result(run_id, step, call_id))

    def sandbox_pending(self, run_id: str, step: int) -> bool:
        """Whether a sandbox task still works on (or waits in line for) a call of this step."""
        return bool(self.r.exists(keys.sandbox_pending(run_id, step)))
