"""Once-only claims on a step's calls, each a marker the first caller sets: a sandboxed call's dispatch
(taken by the delivery that sends it, given up by the reaper so that a re-run sends it again) and the
count of a call's approval decision in the metrics. Working keys of the run (run_keys.working_keys)."""

from __future__ import annotations

import redis

from . import keys
from .cas import Command


class Claims:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def claim_dispatch(self, run_id: str, step: int, call_id: str, ttl_s: int) -> bool:
        """True for the first delivery to send this sandboxed call (until `ttl_s` passes or it is released)."""
        [claim] = self.dispatch_commands(run_id, step, [call_id], ttl_s)
        return bool(self.r.execute_command(*claim))

    @staticmethod
    def dispatch_commands(run_id: str, step: int, call_ids: list[str], ttl_s: int) -> list[Command]:
        """claim_dispatch's claims as commands, for a write that records them with others."""
        return [("SET", keys.sandbox_dispatch(run_id, step, call_id), "1", "NX", "EX", ttl_s) for call_id in call_ids]

    def release_dispatch(self, run_id: str, step: int, call_ids: list[str]) -> None:
        """Forget that the step's sandboxed calls were sent, so that its re-run sends them again."""
        if call_ids:
            self.r.delete(*(keys.sandbox_dispatch(run_id, step, call_id) for call_id in call_ids))

    def claim_approval_count(self, run_id: str, step: int, call_id: str, ttl_s: int) -> bool:
        """True for the first delivery to count this call's approval decision."""
        return bool(self.r.set(keys.approval_counted(run_id, step, call_id), "1", nx=True, ex=ttl_s))
