"""The requests in flight to each model's server, shared by every worker: a slot per request, held for a
while and renewed while the answer streams, so that a worker that dies mid-call frees its slot when its hold
lapses. Whether a call may go out is `worker/llm/in_flight.py`'s business."""

from __future__ import annotations

import redis

from . import keys
from .scripts import lua

__all__ = ["LLMSlots"]

TAKE = lua(__file__, "take_slots.lua")


class LLMSlots:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._take = client.register_script(TAKE)

    def take(self, model: str, token: str, cap: int, hold_ms: int) -> bool:
        """One of the model's `cap` slots for `hold_ms`, or False when all are held."""
        return self._take(keys=[keys.llm_in_flight(model)], args=[token, hold_ms, cap]) == 0

    def renew(self, model: str, token: str, hold_ms: int) -> bool:
        """Hold the slot `hold_ms` more (False: it lapsed meanwhile, and was dropped)."""
        return self._take(keys=[keys.llm_in_flight(model)], args=[token, hold_ms, 0]) == 0

    def give_back(self, model: str, token: str) -> None:
        self.r.zrem(keys.llm_in_flight(model), token)
