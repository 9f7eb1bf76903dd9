"""A cap on the requests in flight to a model's server, over every worker (REACTQ_MODELS' `max_in_flight`):
a server with N slots (llama.cpp's `-np`, a GPU's batch) that is sent 10N requests queues them, and each
waits for the ones before it while its own timeout runs. With the cap, a step whose model has no free slot
goes back to the queue for about a second (LLMThrottled, reason `in_flight`) and its thread serves others.

A slot is held from just before the request goes out until its answer has come (or failed), and renewed
while the answer streams; the hold outlasts the longest silence a call may have (the LLM timeout), so a
worker that dies mid-call frees its slot soon after. Redis's side is `worker/store/llm_slots.py`.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .. import metrics
from ..errors import LLMThrottled
from ..store.llm_slots import LLMSlots

__all__ = ["InFlightCap", "KeepAlive"]

KeepAlive = Callable[[], None]  # called as the answer streams: renews the slot's hold now and then
RETRY_S = 1.0  # a step that found no free slot comes back after about this long


def _nothing() -> None:
    return None


class InFlightCap:
    def __init__(self, slots: LLMSlots, caps: dict[str, int], hold_s: float) -> None:
        self.slots = slots
        self.caps = caps
        self.hold_s = hold_s

    @contextmanager
    def slot(self, model: str) -> Iterator[KeepAlive]:
        """Hold one of the model's slots for the request made inside; LLMThrottled when none is free."""
        cap = self.caps.get(model)
        if cap is None:
            yield _nothing
            return
        token, hold_ms = uuid.uuid4().hex, int(self.hold_s * 1000)
        if not self.slots.take(model, token, cap, hold_ms):
            metrics.LLM_THROTTLED.labels(model, "in_flight").inc()
            raise LLMThrottled(model, "in_flight", RETRY_S * random.uniform(0.5, 1.5))
        renewed_at = time.monotonic()

        def keep_alive() -> None:
            nonlocal renewed_at
            if time.monotonic() - renewed_at >= self.hold_s / 3:
                renewed_at = time.monotonic()
                self.slots.renew(model, token, hold_ms)

        try:
            yield keep_alive
        finally:
            self.slots.give_back(model, token)
