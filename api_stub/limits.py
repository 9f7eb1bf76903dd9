"""Server-side rate limits, like a real provider's: requests and tokens per minute, enforced over short
intervals (a limit of 600 per minute admits about 10 per second, never 600 at once).

Two ways, as providers do it:
- by default each budget is a GCRA cell (theoretical arrival time, one emission interval per request or
  token) with a burst tolerance of `burst_s` seconds' worth;
- with `window_s` > 0 the minute is quantised into fixed windows of that many seconds, aligned to the
  clock (`now // window_s`): each admits its share, `limit * window_s / 60` requests (and tokens), rounded
  down, and refuses the rest until the next window starts.

A request over either budget is refused with the time after which it would be admitted (the 429's
Retry-After). Pure and in-process: one stub server, one clock (the server passes wall time).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

__all__ = ["Refusal", "ServerLimits", "window_share"]


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


def window_share(per_minute: int, window_s: float) -> int:
    """What one fixed window admits of a per-minute limit: its share, rounded down, at least one."""
    return max(1, math.floor(per_minute * window_s / 60 + 1e-9))


@dataclass
class _Window:
    """The current fixed window: which one (`now // seconds`) and what it has admitted so far."""

    seconds: float
    index: int = -1
    used: dict[str, int] = field(default_factory=dict)

    def roll(self, now: float) -> None:
        index = math.floor(now / self.seconds)
        if index != self.index:
            self.index, self.used = index, {}

    def left_s(self, now: float) -> float:
        return (self.index + 1) * self.seconds - now


@dataclass
class ServerLimits:
    rpm: int = 0  # 0: no limit
    tpm: int = 0
    burst_s: float = 1.0
    window_s: float = 0.0  # > 0: fixed windows of this many seconds instead of GCRA cells
    _cells: dict[str, _Cell] = field(default_factory=dict, repr=False)
    _window: _Window | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.window_s > 0:
            self._window = _Window(self.window_s)
            return
        if self.rpm:
            self._cells["rpm"] = _Cell(self.rpm)
        if self.tpm:
            self._cells["tpm"] = _Cell(self.tpm)

    def admit(self, now: float, prompt_tokens: int) -> Refusal | None:
        """Charge one request and its prompt tokens, or say how long until it would be admitted."""
        with self._lock:
            if self._window is not None:
                return self._admit_in_window(self._window, now, prompt_tokens)
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
            if self._window is not None:
                self._window.roll(now)
                self._window.used["tpm"] = self._window.used.get("tpm", 0) + tokens
            elif (cell := self._cells.get("tpm")) is not None:
                cell.charge(now, tokens)

    def _admit_in_window(self, window: _Window, now: float, prompt_tokens: int) -> Refusal | None:
        """Fixed windows: the request, and its prompt tokens, must fit in what this window has left (a
        request larger than a whole window's tokens is admitted only into an empty window)."""
        window.roll(now)
        requests, tokens = window.used.get("rpm", 0), window.used.get("tpm", 0)
        if self.rpm and requests + 1 > window_share(self.rpm, self.window_s):
            return Refusal("rpm", window.left_s(now))
        if self.tpm and tokens and tokens + prompt_tokens > window_share(self.tpm, self.window_s):
            return Refusal("tpm", window.left_s(now))
        window.used["rpm"], window.used["tpm"] = requests + 1, tokens + prompt_tokens
        return None
