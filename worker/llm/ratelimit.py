"""Provider limits shared by every worker: per-model requests and tokens per minute, held in Redis.

Each budget (rpm, tpm) of a model in REACTQ_MODELS is a GCRA cell in Redis (`worker/store/provider_limits.py`
runs them): the theoretical arrival time (TAT) of the next unit, on Redis's own clock so that every worker
host agrees. One Lua script checks the model's cool-down and both cells and, when the wait is short,
*reserves* the slot: the caller sleeps until its reserved time and calls. Reservations are spaced one
emission interval apart (60 s / limit), so calls are paced evenly across all workers instead of spending a
minute's budget in a burst; the burst tolerance (`REACTQ_LLM_LIMIT_BURST_S`) bounds how many may go at once.

Giving the slot back: a wait longer than `REACTQ_LLM_LIMIT_MAX_WAIT_S` reserves nothing and raises
`LLMThrottled` with the wait; the step task re-queues itself with that countdown, so the worker thread
serves other runs (and models) meanwhile. Short waits are slept, which is the pacing itself.

Tokens are reserved before the call from an estimate (prompt characters / 4 plus a completion reserve)
and settled against the reply's usage afterwards. A 429 from the provider sets the model's cool-down
(its Retry-After, else a default) which every worker honours before its next call.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..config import ModelSpec
from ..core.models import LLMReply
from ..errors import LLMThrottled
from ..store.provider_limits import ProviderLimits
from .client import LLMClient

__all__ = ["Acquired", "LimitedLLM", "RateLimiter", "estimate_tokens"]

COMPLETION_RESERVE = 256  # tokens reserved for a reply when the call sets no max_tokens
DEFAULT_COOLDOWN_S = 1.0


@dataclass(frozen=True)
class Acquired:
    """A reserved slot: start the call after `wait_s` (0 when capacity was free)."""

    wait_s: float
    binding: str | None  # the budget that made us wait, if any


def estimate_tokens(messages: list[dict[str, Any]], options: dict[str, Any]) -> int:
    """Prompt characters / 4 (plus the tool schemas) and a completion reserve: reserved before the call."""
    chars = len(json.dumps(messages, default=str)) + len(json.dumps(options.get("tools") or [], default=str))
    completion = options.get("max_completion_tokens") or options.get("max_tokens") or COMPLETION_RESERVE
    return math.ceil(chars / 4) + int(completion)


class RateLimiter:
    """The shared limiter of every model in REACTQ_MODELS with an rpm or tpm (others are never checked)."""

    def __init__(self, cells: ProviderLimits, models: dict[str, ModelSpec], *, burst_s: float = 0.5,
                 max_wait_s: float = 2.0) -> None:
        self.cells = cells
        self.models = {name: spec for name, spec in models.items() if spec.rpm or spec.tpm}
        self.burst_us = int(burst_s * 1e6)
        self.max_wait_us = int(max_wait_s * 1e6)

    def limited(self, model: str) -> bool:
        return model in self.models

    def try_acquire(self, model: str, tokens: int) -> Acquired:
        """Reserve one request and `tokens` for `model`, or raise LLMThrottled when the wait is too long."""
        spec = self.models.get(model)
        if spec is None:
            return Acquired(0.0, None)
        rpm_us = 60e6 / spec.rpm if spec.rpm else 0
        tpm_us = 60e6 / spec.tpm if spec.tpm else 0
        status, wait_us = self.cells.acquire(model, rpm_us, tpm_us, tokens, self.burst_us, self.max_wait_us)
        wait_s = max(0.0, float(wait_us) / 1e6)
        if status != "ok":
            metrics.LLM_THROTTLED.labels(model, status).inc()
            raise LLMThrottled(model, status, wait_s)
        binding = None
        if wait_s > 0:
            binding = "pacing"
            metrics.LLM_THROTTLED.labels(model, "pacing").inc()
        return Acquired(wait_s, binding)

    def settle(self, model: str, reserved: int, used: int) -> None:
        spec = self.models.get(model)
        if spec is None or not spec.tpm or used == reserved:
            return
        self.cells.settle(model, 60e6 / spec.tpm, used - reserved)

    def cool_down(self, model: str, seconds: float | None) -> None:
        """A provider 429: nobody calls `model` for `seconds` (its Retry-After) or the default."""
        metrics.LLM_THROTTLED.labels(model, "provider_429").inc()
        if model in self.models:
            ms = max(1, int((seconds if seconds is not None else DEFAULT_COOLDOWN_S) * 1000))
            self.cells.cool_down(model, ms)


class LimitedLLM:
    """An LLMClient that takes its capacity from the shared limiter before each call."""

    def __init__(self, inner: LLMClient, limiter: RateLimiter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner = inner
        self.limiter = limiter
        self._sleep = sleep

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> LLMReply:
        model = str(options.get("model", ""))
        if not self.limiter.limited(model):
            return self.inner.chat(messages, **options)
        reserved = estimate_tokens(messages, options)
        grant = self.limiter.try_acquire(model, reserved)
        metrics.LLM_LIMITER_WAIT.labels(model).observe(grant.wait_s)
        if grant.wait_s > 0:
            self._sleep(grant.wait_s)
        reply = self.inner.chat(messages, **options)
        self.limiter.settle(model, reserved, reply.usage.prompt_tokens + reply.usage.completion_tokens)
        return reply
