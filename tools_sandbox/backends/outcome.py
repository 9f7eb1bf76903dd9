"""The end of every execution, shared by both backends: host facts + the agent's frames -> SandboxResult.

A backend reads the agent's frames until the exit record, the wall-clock deadline or the
output cap, kills the sandbox, measures it, and hands what it *knows* (`HostFacts`) and what
it *heard* (the FrameParser) to `finish`. The rule: the host decides. A frame stream that
breaks the protocol, or an agent that dies without reporting (only the program can kill it,
short of the OOM killer), is a protocol violation: the program's claims — output included —
are dropped and the model is told so in one sentence. Only a failure of our own machinery
(`infra_error`) is `unavailable`; in Docker, where the program cannot reach its supervisor, a
container that ended without the exit record is one (frames.lost), and the pool runs the call again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..base.models import ErrorKind, SandboxResult, Tier
from ..base.protocol import FrameParser, decode, interpret_exit
from ..base.render import PROTOCOL_VIOLATION, UNAVAILABLE_TEXT

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class HostFacts:
    """What the host observed about one execution (never what the sandbox said)."""

    started: float  # time.monotonic() when the call began
    timed_out: bool = False  # the wall-clock deadline passed
    cpu_seconds: float | None = None  # the sandbox's cgroup, or wait4 of its whole process tree
    memory_peak_bytes: int | None = None
    oom_killed: bool = False  # the kernel's OOM killer acted in the sandbox
    infra_error: str | None = None  # our side failed (engine, socket): logged, never shown
    agent_said: bytes = b""  # the agent's own stderr, for the log


def finish(tier: Tier, backend: str, parser: FrameParser, facts: HostFacts) -> SandboxResult:
    """The result of one execution, decided from host facts; the program's claims only where harmless."""
    common: dict[str, Any] = {"tier": tier.name, "backend": backend, "cpu_seconds": facts.cpu_seconds,
              "memory_peak_bytes": facts.memory_peak_bytes,
              "duration_ms": int((time.monotonic() - facts.started) * 1000)}
    if facts.infra_error is not None:
        log.warning("sandbox infrastructure failure on tier %s: %s", tier.name, facts.infra_error)
        return SandboxResult(exit_code=None, stdout="", stderr="", error=UNAVAILABLE_TEXT,
                             error_kind=ErrorKind.UNAVAILABLE, **common)
    stdout, stderr = decode(parser.stdout), decode(parser.stderr)
    if facts.timed_out:
        return SandboxResult(exit_code=None, stdout=stdout, stderr=stderr, timed_out=True,
                             oom_killed=facts.oom_killed, truncated=parser.truncated,
                             error_kind=ErrorKind.TIMEOUT, **common)
    if parser.truncated and parser.exit is None and parser.protocol_error is None:
        # The host stopped reading at the cap and killed the sandbox.
        return SandboxResult(exit_code=None, stdout=stdout, stderr=stderr, truncated=True,
                             error_kind=ErrorKind.OUTPUT_LIMIT, **common)
    record = parser.exit
    if record is None and facts.oom_killed:
        return SandboxResult(exit_code=None, stdout=stdout, stderr=stderr, oom_killed=True,
                             truncated=parser.truncated, error_kind=ErrorKind.OOM, **common)
    if record is None:
        why = parser.protocol_error or "the agent ended without an exit record"
        log.warning("protocol violation on tier %s (%s); agent stderr: %r", tier.name, why,
                    decode(facts.agent_said)[-300:])
        return SandboxResult(exit_code=None, stdout="", stderr="", error=PROTOCOL_VIOLATION,
                             error_kind=ErrorKind.PROTOCOL_VIOLATION, **common)
    info = interpret_exit(record, tier, facts.cpu_seconds)
    oom = facts.oom_killed or info.memory_error
    truncated = parser.truncated or record.truncated
    kind = (ErrorKind.TIMEOUT if info.cpu_limited else ErrorKind.OOM if oom
            else ErrorKind.OUTPUT_LIMIT if truncated else None)
    return SandboxResult(exit_code=info.exit_code, stdout=stdout, stderr=stderr + info.stderr_note,
                         timed_out=info.cpu_limited, oom_killed=oom, truncated=truncated, error_kind=kind,
                         **common)
