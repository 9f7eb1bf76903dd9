"""Provider limits shared by every worker: per-model requests and tokens per minute, held in Redis.

Each budget (rpm, tpm) of a model in REACTQ_MODELS is a GCRA cell in Redis (`worker/store/provider_limits.py`
runs them): the theoretical arrival time (TAT) of the next unit, on Redis's own clock so that every worker
host agrees. One Lua script checks the model's cool-down and both cells and, when the wait is short,
*reserves* the slot: the caller sleeps until its reserved time and calls. Reservations are spaced one
emission interval apart (60 s / limit), so calls are paced evenly across all workers instead of spending a
minute's budget in a burst; the burst tolerance (`REACTQ_LLM_LIMIT_BURST_S`) bounds how many may go at once.

Providers quantise a per-minute limit into short windows: 240/min over 2 s windows admits 8 in each, and a
ninth is a 429 even if the minute is far from spent. A user seldom knows the window, so by default (no
`window_s`) calls are spaced evenly: both cells have no burst tolerance (one call per interval) and the
window guard below holds each call until a full interval after the previous *send*, with no catching up.
Calls one interval apart put at most ceil(W / T) in any W seconds, and at <= 85% of the provider's limit
that fits every window of 1 to 10 s with room for sends to bunch by 15% of the window on the way (a call
recorded at t arrives at t + delay; under load the delays differ). With a known `window_s`, no `window_s`
seconds may see more calls than the window's share of the limit, rounded up (`window_share`), which is
what calls one interval apart give, and late calls may catch up:
- each cell's burst tolerance is capped below what would let one more call in (`window_burst_us`): less
  than one interval, whatever REACTQ_LLM_LIMIT_BURST_S says; the paced rate itself is unchanged;
- right before the request goes out (the client's `before_send`), a second script (the window guard)
  records its send time, and holds it while the last window already saw its share or the previous call
  went less than half an interval ago (a full interval with no `window_s`). Calls slept to their slots
  can still bunch up (a descheduled worker wakes late, next to the next slot's caller; a process's first
  call imports openai); the guard spreads them out again, catching up at twice the rate at most (not at
  all with no `window_s`). Requests only: a call's tokens are an estimate
  until the reply, and the tpm cell paces them one token interval apart anyway.
- the guard also holds calls reserved before a provider 429 until its cool-down ends (a cool-down longer
  than the bounded wait re-queues them), and the client retries a 429 only through `before_retry` (a new
  slot, then the guard), not straight into the window that just refused it.
Configure rpm so that the share, rounded up, is within the provider's per-window share (200/min over 2 s:
7 of the provider's 8 at 240/min).

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

__all__ = ["Acquired", "LimitedLLM", "Pacing", "RateLimiter", "estimate_tokens", "pacing", "window_burst_us",
           "window_share"]

COMPLETION_RESERVE = 256  # tokens reserved for a reply when the call sets no max_tokens
DEFAULT_COOLDOWN_S = 1.0
WINDOW_TRIES = 20  # window-guard holds of one call before it gives up its slot (re-queued)
UNKNOWN_WINDOW_S = 1.0  # with no window_s: the shortest window providers are known to enforce in


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


def window_share(per_minute: int, window_s: float) -> int:
    """The calls one window of `window_s` may see at `per_minute`: its share rounded up (what calls one
    interval apart put in a window), at least one."""
    return max(1, math.ceil(per_minute * window_s / 60 - 1e-9))


def window_burst_us(interval_us: float, window_us: float, burst_us: int) -> int:
    """A cell's burst tolerance capped so that no window of `window_us` sees more reservations than calls
    one interval apart would put there: n fit in a window when (n - 1) x interval - burst < window, so the
    burst must stay below ceil(window / interval) x interval - window (always less than one interval)."""
    if window_us <= 0 or interval_us <= 0:
        return burst_us
    room = math.ceil(window_us / interval_us - 1e-9) * interval_us - window_us
    return max(0, min(burst_us, math.ceil(room) - 1))


@dataclass(frozen=True)
class Pacing:
    """One model's limits in the units the scripts take: µs per request and per token (0: no budget), the
    cells' burst tolerances, and the window guard (window µs and its share of requests, 0: no guard; the
    least µs between two sends)."""

    rpm_us: float
    tpm_us: float
    rpm_burst_us: int
    tpm_burst_us: int
    window_us: int
    window_calls: int
    spacing_us: int


def pacing(spec: ModelSpec, burst_s: float) -> Pacing:
    rpm_us = 60e6 / spec.rpm if spec.rpm else 0.0
    tpm_us = 60e6 / spec.tpm if spec.tpm else 0.0
    if spec.window_s is None:  # the provider's window is unknown: one call per interval, sends included
        calls = window_share(spec.rpm, UNKNOWN_WINDOW_S) if spec.rpm else 0
        return Pacing(rpm_us, tpm_us, 0, 0, int(UNKNOWN_WINDOW_S * 1e6) if calls else 0, calls, int(rpm_us))
    burst_us, window_us = int(burst_s * 1e6), int(spec.window_s * 1e6)
    calls = window_share(spec.rpm, spec.window_s) if spec.rpm and window_us else 0
    return Pacing(rpm_us, tpm_us, window_burst_us(rpm_us, window_us, burst_us),
                  window_burst_us(tpm_us, window_us, burst_us), window_us if calls else 0, calls,
                  int(rpm_us / 2))  # late calls catch up at twice the rate at most


class RateLimiter:
    """The shared limiter of every model in REACTQ_MODELS with an rpm or tpm (others are never checked)."""

    def __init__(self, cells: ProviderLimits, models: dict[str, ModelSpec], *, burst_s: float = 0.5,
                 max_wait_s: float = 2.0) -> None:
        self.cells = cells
        self.models = {name: spec for name, spec in models.items() if spec.rpm or spec.tpm}
        self.pacing = {name: pacing(spec, burst_s) for name, spec in self.models.items()}
        self.max_wait_us = int(max_wait_s * 1e6)

    def limited(self, model: str) -> bool:
        return model in self.models

    def try_acquire(self, model: str, tokens: int) -> Acquired:
        """Reserve one request and `tokens` for `model`, or raise LLMThrottled when the wait is too long."""
        plan = self.pacing.get(model)
        if plan is None:
            return Acquired(0.0, None)
        status, wait_us = self.cells.acquire(model, plan.rpm_us, plan.tpm_us, tokens,
                                             (plan.rpm_burst_us, plan.tpm_burst_us), self.max_wait_us)
        wait_s = max(0.0, float(wait_us) / 1e6)
        if status != "ok":
            metrics.LLM_THROTTLED.labels(model, status).inc()
            raise LLMThrottled(model, status, wait_s)
        binding = None
        if wait_s > 0:
            binding = "pacing"
            metrics.LLM_THROTTLED.labels(model, "pacing").inc()
        return Acquired(wait_s, binding)

    def pace(self, model: str, tokens: int, sleep: Callable[[float], None] = time.sleep) -> float:
        """Take a slot for one call of `model` and `tokens` and sleep to its reserved time; the seconds
        waited. LLMThrottled when the slot is too far off (nothing reserved)."""
        grant = self.try_acquire(model, tokens)
        metrics.LLM_LIMITER_WAIT.labels(model).observe(grant.wait_s)
        if grant.wait_s > 0:
            sleep(grant.wait_s)
        return grant.wait_s

    def before_retry(self, model: str) -> None:
        """The client retries a call the provider refused (429) through the limiter too, as a new request
        (its tokens were reserved for the first attempt); for models without limits, nothing."""
        if self.limited(model):
            self.pace(model, 0)

    def before_send(self, model: str, sleep: Callable[[float], None] = time.sleep) -> float:
        """The window guard, right before a request goes out (after the client is ready: what happens
        between the guard and the wire is what the provider's window sees late); the seconds held."""
        return self._hold_for_window(model, sleep)

    def _hold_for_window(self, model: str, sleep: Callable[[float], None]) -> float:
        """Wait until the window guard records this call; the seconds held. A cool-down longer than the
        bounded wait, or WINDOW_TRIES holds, give the slot up (LLMThrottled: the step is re-queued)."""
        plan = self.pacing.get(model)
        if plan is None or not plan.window_calls:
            return 0.0
        held, wait_s = 0.0, 0.0
        for _ in range(WINDOW_TRIES):
            status, wait_us = self.cells.send(model, plan.window_us, plan.window_calls, plan.spacing_us)
            if status == "ok":
                return held
            wait_s = max(0.0, wait_us / 1e6)
            if status == "cooldown" and wait_us > self.max_wait_us:
                metrics.LLM_THROTTLED.labels(model, "cooldown").inc()
                raise LLMThrottled(model, "cooldown", wait_s)
            if not held:
                metrics.LLM_THROTTLED.labels(model, "window").inc()
            sleep(wait_s)
            held += wait_s
        raise LLMThrottled(model, "window", wait_s)

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
        self.limiter.pace(model, reserved, self._sleep)  # the client's before_send is the window guard
        reply = self.inner.chat(messages, **options)
        self.limiter.settle(model, reserved, reply.usage.prompt_tokens + reply.usage.completion_tokens)
        return reply
