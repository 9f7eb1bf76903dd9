"""A circuit per model's provider, shared by every worker: when a call fails for a reason a later call may
not have (connection refused, a timeout, a 5xx, a 429 after the client's own retries), the circuit opens for
a backoff (base, 2×base, 4×base… up to a cap, per round of failures in a row) and nobody calls the model
until it closes; the step goes back to the queue until then (worker/core/provider_trouble.py), so a dead
server is not hammered by every worker thread, and no worker thread sleeps through the outage.

Hot path: one GET of the circuit per model and process at most once per `refresh_s` (a cached view), and a
DEL only after failures were seen. The state is in Redis (`worker/store/provider_circuit.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .. import metrics
from ..core.models import LLMReply
from ..core.provider_trouble import TRANSIENT_OUTCOMES
from ..errors import LLMError
from ..store.provider_circuit import ProviderCircuits
from .client import LLMClient

__all__ = ["CircuitLLM"]


class CircuitLLM:
    """An LLMClient that does not call a model whose circuit is open, and opens it when calls fail."""

    def __init__(self, inner: LLMClient, circuits: ProviderCircuits, *, base_s: float, cap_s: float,
                 refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.circuits = circuits
        self.base_ms, self.cap_ms = int(base_s * 1000), int(cap_s * 1000)
        self.refresh_s = refresh_s
        self.clock = clock
        self._open_until: dict[str, tuple[float, float]] = {}  # model -> (read at, open until), clock time
        self._troubled: set[str] = set()  # models seen failing or open here since their last success
        self._lock = threading.Lock()

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> LLMReply:
        model = str(options.get("model", ""))
        left = self._open_for(model)
        if left > 0:
            metrics.LLM_THROTTLED.labels(model, "circuit_open").inc()
            raise LLMError(f"LLM call not sent: the provider of {model} is failing (circuit open for {left:.1f} s)",
                           0, "circuit_open", retry_after_s=left)
        try:
            reply = self.inner.chat(messages, **options)
        except LLMError as exc:
            if exc.outcome in TRANSIENT_OUTCOMES:
                _, open_ms = self.circuits.trip(model, self.base_ms, self.cap_ms)
                self._saw_open(model, open_ms / 1000)
                exc.retry_after_s = max(exc.retry_after_s or 0.0, open_ms / 1000)
            raise
        if model in self._troubled:
            self.circuits.reset(model)
            with self._lock:
                self._troubled.discard(model)
                self._open_until.pop(model, None)
            metrics.LLM_CIRCUIT_OPEN.labels(model).set(0)
        return reply

    def _open_for(self, model: str) -> float:
        """Seconds the model's circuit stays open, as last read (read again after `refresh_s`)."""
        now = self.clock()
        seen = self._open_until.get(model)
        if seen is None or now - seen[0] >= self.refresh_s:
            left = self.circuits.open_ms(model) / 1000
            if left > 0:
                self._saw_open(model, left)
            else:
                with self._lock:
                    self._open_until[model] = (now, now)
                if seen is not None and seen[1] > seen[0]:
                    metrics.LLM_CIRCUIT_OPEN.labels(model).set(0)
            return left
        return max(0.0, seen[1] - now)

    def _saw_open(self, model: str, left_s: float) -> None:
        now = self.clock()
        with self._lock:
            self._open_until[model] = (now, now + left_s)
            self._troubled.add(model)
        metrics.LLM_CIRCUIT_OPEN.labels(model).set(1)
