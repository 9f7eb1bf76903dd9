"""The provider limiter's cells in Redis: per model, a GCRA cell per budget (rpm, tpm) and a cool-down.

The cells hold theoretical arrival times in µs on Redis's own clock, so every worker host agrees; the three
scripts (`.lua` beside this module) check and move them atomically. What the intervals are, how long a
caller may wait and what a refusal means is `worker/llm/ratelimit.py`'s business."""

from __future__ import annotations

import redis

from . import keys
from .scripts import lua

__all__ = ["ACQUIRE", "COOL_DOWN", "SETTLE", "ProviderLimits"]

ACQUIRE = lua(__file__, "acquire.lua")

SETTLE = lua(__file__, "settle.lua")

COOL_DOWN = lua(__file__, "cool_down.lua")


class ProviderLimits:
    """Runs the limiter's scripts; intervals are µs per request (rpm) or per token (tpm), 0 for no budget."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._acquire = client.register_script(ACQUIRE)
        self._settle = client.register_script(SETTLE)
        self._cool_down = client.register_script(COOL_DOWN)

    def acquire(self, model: str, rpm_us: float, tpm_us: float, tokens: int, burst_us: int,
                max_wait_us: int) -> tuple[str, float]:
        """Reserve one request and `tokens` unless the wait exceeds `max_wait_us`: `("ok", wait µs)` when
        reserved, else the binding budget (`cooldown` | `rpm` | `tpm`) and its wait, with nothing reserved."""
        status, wait_us = self._acquire(
            keys=[keys.llm_limit(model, "rpm"), keys.llm_limit(model, "tpm"), keys.llm_cooldown(model)],
            args=[f"{rpm_us:.3f}", f"{tpm_us:.3f}", tokens, burst_us, max_wait_us],
        )
        return (status.decode() if isinstance(status, bytes) else str(status)), float(wait_us)

    def settle(self, model: str, tpm_us: float, difference: int) -> None:
        """Move the tpm cell by `difference` tokens (used - reserved); never before now."""
        self._settle(keys=[keys.llm_limit(model, "tpm")], args=[f"{tpm_us:.3f}", difference])

    def cool_down(self, model: str, ms: int) -> None:
        """Nobody calls `model` for `ms` milliseconds (only ever lengthens a cool-down)."""
        self._cool_down(keys=[keys.llm_cooldown(model)], args=[ms])
