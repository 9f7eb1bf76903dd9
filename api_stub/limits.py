"""Server-side rate limits, like a real provider's: requests and tokens per minute, enforced over short
intervals (a limit of 600 per minute admits about 10 per second, never 600 at once).

Each budget is a GCRA cell (theoretical arrival time, one emission interval per request or token) with a
burst tolerance of `burst_s` seconds' worth. A request over either budget is refused with the time after
which it would be admitted (the 429's Retry-After). Pure and in-process: one stub server, one clock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["Refusal", "ServerLimits"]


@dataclass(frozen=True)
class Refusal:
    budget: str  # "rpm" | "tpm"
    retry_after_s: float


@dataclass
class _Cell:
    per_minute: int
    tat: float = 0.0  # theoretical arrival time of the next unit

    @property
    def interval(self) -> float:
        return 60.0 / self.per_minute

    def wait(self, now: float, burst_s: float) -> float:
        return max(0.0, self.tat - now - burst_s)

    def charge(self, now: float, units: int) -> None:
        self.tat = max(self.tat, now) + units * self.interval


@dataclass
class ServerLimits:
    rpm: int = 0  # 0: no limit
    tpm: int = 0
    burst_s: float = 1.0
    _cells: dict[str, _Cell] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.rpm:
            self._cells["rpm"] = _Cell(self.rpm)
        if self.tpm:
            self._cells["tpm"] = _Cell(self.tpm)

    def admit(self, now: float, prompt_tokens: int) -> Refusal | None:
        """Charge one request and its prompt tokens, or say how long until it would be admitted."""
        with self._lock:
            for name, cell in self._cells.items():
                wait = cell.wait(now, self.burst_s)
                if wait > 0:
                    return Refusal(name, wait)
            for name, cell in self._cells.items():
                cell.charge(now, 1 if name == "rpm" else prompt_tokens)
        return None

    def charge_completion(self, now: float, tokens: int) -> None:
        """Completion tokens count against the token budget once they are known."""
        with self._lock:
            if (cell := self._cells.get("tpm")) is not None:
                cell.charge(now, tokens)
