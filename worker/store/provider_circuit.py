"""The circuit of each model's provider, shared by every worker: how many calls failed in a row, and
whether the circuit is open (nobody calls the model until it closes). What counts as a failure and what
an open circuit does is `worker/llm/circuit.py`'s business."""

from __future__ import annotations

import redis

from . import keys
from .scripts import lua

__all__ = ["ProviderCircuits"]

TRIP = lua(__file__, "trip_circuit.lua")
FAILURES_TTL_MS = 15 * 60 * 1000  # a failure older than this (and nothing since) is forgotten


class ProviderCircuits:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._trip = client.register_script(TRIP)

    def open_ms(self, model: str) -> int:
        """How long the model's circuit stays open (0: closed)."""
        return max(0, int(self.r.pttl(keys.llm_circuit(model))))

    def trip(self, model: str, base_ms: int, cap_ms: int) -> tuple[int, int]:
        """A call failed: (rounds failed in a row, ms the circuit is open for). Failures while it is open
        do not count: they were in flight when it opened."""
        failures, open_ms = self._trip(keys=[keys.llm_failures(model), keys.llm_circuit(model)],
                                       args=[base_ms, cap_ms, FAILURES_TTL_MS])
        return int(failures), int(open_ms)

    def reset(self, model: str) -> None:
        """A call succeeded: no failures in a row, the circuit closed."""
        self.r.delete(keys.llm_failures(model), keys.llm_circuit(model))
