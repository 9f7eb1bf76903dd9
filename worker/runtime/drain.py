"""Warm shutdown with a drain timeout: what a step worker does on SIGTERM.

Celery's warm shutdown stops taking messages and waits for the tasks in flight. A step waits on an LLM
call that may take minutes, longer than an orchestrator waits (terminationGracePeriodSeconds), so the
wait is bounded: steps still running after `REACTQ_DRAIN_TIMEOUT_S` go back to the queue (their leases
released, their step re-sent) and the process exits. A re-sent step reuses whatever the first attempt
stored (the LLM reply, tool results), so only a call whose reply had not arrived is asked again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .leases import LeaseKeeper

log = logging.getLogger("reactq.drain")


class InFlight:
    """The steps this process is running now, as (run id, step index)."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def track(self, run_id: str, index: int) -> Iterator[None]:
        key = (run_id, index)
        with self._lock:
            self._steps[key] = self._steps.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                if self._steps[key] == 1:
                    del self._steps[key]
                else:
                    self._steps[key] -= 1

    def snapshot(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._steps)


IN_FLIGHT = InFlight()


def start_drain(timeout_s: float, requeue: Callable[[str, int], None], leases: LeaseKeeper,
                in_flight: InFlight = IN_FLIGHT, exit: Callable[[int], None] = os._exit) -> threading.Thread:
    """After `timeout_s`, hand the steps still running back to the queue and end the process."""

    def expire() -> None:
        threading.Event().wait(timeout_s)
        steps = in_flight.snapshot()
        if not steps:
            return  # Celery is finishing its own shutdown
        leases.surrender()
        for run_id, index in steps:
            requeue(run_id, index)
        log.warning("drain timeout: %d step(s) still running went back to the queue", len(steps),
                    extra={"steps": len(steps), "drain_timeout_s": timeout_s})
        exit(0)

    thread = threading.Thread(target=expire, name="reactq-drain", daemon=True)
    thread.start()
    return thread
