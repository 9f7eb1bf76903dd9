"""One execution's frames off Docker's attach stream, and what they say about the container's next use.

`Demux` splits the multiplexed stream: the supervisor's stdout goes to the frame parser, its stderr
into a small buffer for the log. `anomaly` says why a container must not serve again after an
execution (the pool retires it), or None when it may. `lost` tells the host's trouble from the
program's: see docs/decisions/warm-containers.md.
"""

from __future__ import annotations

import logging
import struct

from ..base.protocol import FrameParser
from .cgroup import Usage

log = logging.getLogger(__name__)

_AGENT_STDERR_CAP = 4096


def anomaly(parser: FrameParser, timed_out: bool, infra_error: str | None, usage: Usage | None,
             base: Usage | None) -> str | None:
    """Why a container must not serve again after this execution, up to its exit record; None when it may
    (once its cleanup says so: `unsettled`)."""
    if timed_out:
        return "timeout"
    if infra_error is not None:
        return "connection"
    if parser.protocol_error is not None or parser.truncated or parser.exit is None:
        return "protocol"
    if usage is None or base is None:
        return "unmeasured"  # no cgroup view (a remote engine): one execution per container, as before
    if usage.oom_kills > base.oom_kills:
        return "oom"
    return None


def unsettled(parser: FrameParser) -> str | None:
    """Why a container must not serve again after its cleanup (the ready record); None when it may."""
    if parser.ready is None:
        return "no_ready"
    if not parser.ready.clean:
        log.warning("sandbox retired after its cleanup: %s", parser.ready.problem)
        return "unclean"
    return None


LOST = "the container ended without its supervisor's exit record (removed or stopped from outside, or its engine)"


def lost(parser: FrameParser, timed_out: bool, oom_killed: bool) -> str | None:
    """Why the host, not the program, ended this execution; None when it did not.

    In a Docker sandbox the program cannot reach its supervisor (another uid, no capabilities, none
    of its descriptors), so a stream that ends without the exit record, with no deadline, output cap
    or OOM kill to explain it, means the container went away under us: removed, killed or restarted
    from outside. Frames that break the protocol stay the program's doing (a protocol violation).
    """
    if parser.exit is None and parser.protocol_error is None and not parser.truncated and not timed_out \
            and not oom_killed:
        return LOST
    return None


class Demux:
    """Splits Docker's multiplexed attach stream: stdout -> frame parser, stderr -> small buffer."""

    def __init__(self, parser: FrameParser) -> None:
        self.parser = parser
        self.agent_err = bytearray()
        self._head = bytearray()
        self._stream = 0
        self._left = 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left == 0:
                need = 8 - len(self._head)
                self._head += view[:need]
                view = view[need:]
                if len(self._head) < 8:
                    return
                self._stream = self._head[0]
                self._left = struct.unpack(">I", self._head[4:8])[0]
                self._head.clear()
                continue
            take = view[: self._left]
            view = view[len(take):]
            self._left -= len(take)
            if self._stream == 1:
                self.parser.feed(bytes(take))
            elif len(self.agent_err) < _AGENT_STDERR_CAP:
                self.agent_err += take[: _AGENT_STDERR_CAP - len(self.agent_err)]
