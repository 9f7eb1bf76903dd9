"""The provider limiter's cells in Redis: per model, a GCRA cell per budget (rpm, tpm), a cool-down and the
send times of its latest calls (the window guard).

The cells hold theoretical arrival times in µs on Redis's own clock, so every worker host agrees; the four
scripts (`.lua` beside this module) check and move them atomically. What the intervals are, how long a
caller may wait and what a refusal means is `worker/llm/ratelimit.py`'s business."""

from __future__ import annotations

import redis

from . import keys
from .scripts import lua

__all__ = ["ACQUIRE", "COOL_DOWN", "SEND_WINDOW", "SETTLE", "ProviderLimits"]

ACQUIRE = lua(__file__, "acquire.lua")

SETTLE = lua(__file__, "settle.lua")

COOL_DOWN = lua(__file__, "cool_down.lua")

SEND_WINDOW = lua(__file__, "send_window.lua")


class ProviderLimits:
    """Runs the limiter's scripts; intervals are µs per request (rpm) or per token (tpm), 0 for no budget."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._acquire = client.register_script(ACQUIRE)
        self._settle = client.register_script(SETTLE)
        self._cool_down = client.register_script(COOL_DOWN)
        self._send_window = client.register_script(SEND_WINDOW)

    def acquire(self, model: str, rpm_us: float, tpm_us: float, tokens: int, bursts_us: tuple[int, int],
                max_wait_us: int) -> tuple[str, float]:
        """Reserve one request and `tokens` unless the wait exceeds `max_wait_us`: `("ok", wait µs)` when
        reserved, else the binding budget (`cooldown` | `rpm` | `tpm`) and its wait, with nothing reserved.
        `bursts_us` are the rpm and tpm cells' burst tolerances."""
        status, wait_us = self._acquire(
            keys=[keys.llm_limit(model, "rpm"), keys.llm_limit(model, "tpm"), keys.llm_cooldown(model)],
            args=[f"{rpm_us:.3f}", f"{tpm_us:.3f}", tokens, bursts_us[0], bursts_us[1], max_wait_us],
        )
        return (status.decode() if isinstance(status, bytes) else str(status)), float(wait_us)

    def settle(self, model: str, tpm_us: float, difference: int) -> None:
        """Move the tpm cell by `difference` tokens (used - reserved); never before now."""
        self._settle(keys=[keys.llm_limit(model, "tpm")], args=[f"{tpm_us:.3f}", difference])

    def cool_down(self, model: str, ms: int) -> None:
        """Nobody calls `model` for `ms` milliseconds (only ever lengthens a cool-down)."""
        self._cool_down(keys=[keys.llm_cooldown(model)], args=[ms])

    def send(self, model: str, window_us: int, share: int, spacing_us: int) -> tuple[str, float]:
        """Record a call sent now unless `share` were sent in the last `window_us`, one in the last
        `spacing_us`, or the model is cooling down: `("ok", 0)`, else `("window" | "cooldown", µs to
        wait)` with nothing recorded."""
        status, wait_us = self._send_window(keys=[keys.llm_window(model), keys.llm_cooldown(model)],
                                            args=[window_us, share, spacing_us])
        return (status.decode() if isinstance(status, bytes) else str(status)), float(wait_us)
