"""The cyclic garbage collector in a `reactq` command: off while the command imports and sets itself up.

Nearly every object those imports and set-up make (~60,000 for `reactq batch`) lives as long as the process,
yet the collector walked them over and over as they were made: ~160 collections, ~60 ms of the ~0.45 s of
CPU a `reactq batch` costs before it submits (BENCHMARKS.md). Frozen afterwards, they are left out of every
later collection, which then walks only what the command itself makes. The price: a reference cycle left as
garbage while the collector was off is never freed (set-up makes few, once).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def settle() -> None:
    """The set-up is over: freeze what it made, and collect again from here on (a process whose collector
    is on, as under tests, is left as it is)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


@contextmanager
def setting_up() -> Iterator[None]:
    """A stretch of imports and one-time set-up, without the collector (nested: the outermost settles)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            settle()
