"""Host side of the agent wire format (see _agent.py): request encoding, frame parsing.

The parser is incremental and bounded: it never holds more than the tier's output
cap per stream, whatever the sandbox sends (a hostile program can write raw bytes
to the agent's stdout), so the worker's memory stays flat under an output flood.
"""

from __future__ import annotations

import json
import signal
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .models import Tier

_MAX_EXIT_RECORD = 4096


@lru_cache(maxsize=1)
def agent_source() -> str:
    """The agent program passed as `python3 -c` to every sandbox."""
    return (Path(__file__).with_name("_agent.py")).read_text(encoding="utf-8")


def encode_request(code: str, tier: Tier, *, as_bytes: int | None = None, nproc: int | None = None) -> bytes:
    body: dict[str, object] = {
        "code": code,
        "cpu_time_s": tier.cpu_time_s,
        "output_bytes": tier.output_bytes,
    }
    if as_bytes:
        body["as_bytes"] = as_bytes
    if nproc:
        body["nproc"] = nproc
    # ensure_ascii: only printable bytes, never Docker's detach keys on the attached stdin.
    payload = json.dumps(body, ensure_ascii=True).encode("ascii")
    return str(len(payload)).encode("ascii") + b"\n" + payload


@dataclass
class FrameParser:
    """Feeds on the agent's stdout bytes; keeps at most `cap` bytes per stream."""

    cap: int
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit: dict | None = None
    truncated: bool = False
    protocol_error: str | None = None
    _head: bytearray = field(default_factory=bytearray)
    _kind: bytes = b""
    _left: int = 0
    _exit_buf: bytearray = field(default_factory=bytearray)

    @property
    def over_cap(self) -> bool:
        return self.truncated

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.protocol_error is None and self.exit is None:
            if self._left == 0:
                need = 5 - len(self._head)
                self._head += view[:need]
                view = view[need:]
                if len(self._head) < 5:
                    return
                self._kind = bytes(self._head[:1])
                self._left = struct.unpack(">I", self._head[1:5])[0]
                self._head.clear()
                if self._kind not in (b"1", b"2", b"X"):
                    self.protocol_error = f"unexpected frame kind {self._kind!r} from the agent"
                    return
                if self._kind == b"X" and self._left > _MAX_EXIT_RECORD:
                    self.protocol_error = "oversized exit record from the agent"
                    return
                if self._left == 0 and self._kind == b"X":
                    self.protocol_error = "empty exit record from the agent"
                    return
                continue
            take = view[: self._left]
            view = view[len(take):]
            self._left -= len(take)
            if self._kind == b"X":
                self._exit_buf += take
                if self._left == 0:
                    try:
                        self.exit = json.loads(bytes(self._exit_buf))
                    except ValueError:
                        self.protocol_error = "unreadable exit record from the agent"
            else:
                buf = self.stdout if self._kind == b"1" else self.stderr
                room = self.cap - len(buf)
                if len(take) > room:
                    self.truncated = True
                    take = take[: max(room, 0)]
                buf += take


def decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


@dataclass
class ExitInfo:
    """What the agent's exit record means under a tier's limits."""

    exit_code: int | None
    cpu_limited: bool = False
    killed_by_sigkill: bool = False
    memory_error: bool = False
    oom_kills: int = -1
    stderr_note: str = ""


def interpret_exit(record: dict, tier: Tier) -> ExitInfo:
    """Exit code as a shell reports it (128+signal), and which limit, if any, ended the program."""
    sig = record.get("signal")
    info = ExitInfo(exit_code=record.get("exit_code"), memory_error=bool(record.get("memory_error")),
                    oom_kills=int(record.get("oom_kills", -1)))
    if sig is not None:
        info.exit_code = 128 + int(sig)
        # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (soft + 1s).
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and record.get("cpu_s", 0) >= tier.cpu_time_s):
            info.cpu_limited = True
            info.stderr_note = f"\n[cpu time limit of {tier.cpu_time_s}s reached]"
        elif sig == signal.SIGKILL:
            info.killed_by_sigkill = True
    return info
