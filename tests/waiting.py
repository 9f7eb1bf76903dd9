"""The one way tests wait for something to happen: `wait_for(what, probe)`.

`probe` is called every `every` seconds until what it returns is truthy (or, with `until`, until
`until(value)` holds), and that value is returned. When `timeout` runs out the wait fails with a
WaitTimeout naming what never came and the last thing the probe saw, e.g.

    timed out after 120 s waiting for run 3f2a to end; last seen: 'running'

so a failure explains itself. Exceptions of the `ignoring` types (a service still starting, say) count as
"not yet" and are reported as the last value. A probe that raises anything else ends the wait at once: that
is how a wait fails fast (a worker process that died, say).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SHOWN_CHARS = 500  # of the last value's repr, in a timeout's message


class WaitTimeout(TimeoutError, AssertionError):
    """A wait ran out: a test failure (AssertionError), and a TimeoutError for code that waits on services."""


def wait_for(what: str, probe: Callable[[], T], timeout: float = 120, every: float = 0.1, *,
             until: Callable[[T], object] = bool, show: Callable[[T], object] | None = None,
             ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Poll `probe` until `until(value)` holds (by default: the value is truthy) and return the value.

    `what` completes "waiting for ..." in the timeout's message; `show` picks what of the last value the
    message shows (by default all of it, truncated to SHOWN_CHARS)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except ignoring as exc:
            seen: object = exc
        else:
            if until(value):
                return value
            seen = show(value) if show is not None else value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}; last seen: {shown(seen)}")
        time.sleep(every)


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"
