"""The cyclic garbage collector in a `reactq` command: off while the command imports and sets itself up.

Nearly every object those imports and set-up make (~60,000 for `reactq batch`) lives as long as the process,
yet the collector walked them over and over as they were made: ~160 collections, ~60 ms of the ~0.45 s of
CPU a `reactq batch` costs before it submits (BENCHMARKS.md). Frozen afterwards, they are left out of every
later collection, which then walks only what the command itself makes. The price: a reference cycle left as
garbage while the collector was off is never freed (set-up makes few, once).

Only a process started at the `reactq` entry point (`start`) does this; one that calls the commands in-process
(the tests) keeps its collector as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_started_here = False


def start() -> None:
    """The entry point: the collector off until the verb is resolved (`settle`)."""
    global _started_here
    _started_here = True
    gc.disable()


def settle() -> None:
    """The set-up is over: freeze what it made, and collect again from here on."""
    if _started_here and not gc.isenabled():
        gc.freeze()
        gc.enable()


@contextmanager
def setting_up() -> Iterator[None]:
    """A stretch of imports and one-time set-up, without the collector (nested: the outermost settles)."""
    was_enabled = gc.isenabled()
    if _started_here:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            settle()
