"""Host side of the agent wire format (see inside/_agent.py): request encoding, frame parsing.

The parser is incremental and bounded: it never holds more than the tier's output
cap per stream, whatever the sandbox sends (a hostile program can write raw bytes
to the agent's stdout), so the worker's memory stays flat under an output flood.

The exit record is the supervisor's account of the program's end, and the ready record
that follows it says whether the supervisor left the sandbox clean for the next execution.
Both are parsed only when they are small flat JSON objects (checked on the bytes, before
any parser can recurse) and validated strictly; anything else — any exception at all, a
frame after the ready record — is a protocol violation. CPU time, memory and kills come
from the host, never from the sandbox.
"""

from __future__ import annotations

import json
import signal
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .models import Tier

_MAX_EXIT_RECORD = 1024


class ExitRecord(BaseModel):
    """The agent's exit record: ints, None, booleans and non-negative numbers, nothing else."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    exit_code: int | None = Field(ge=0, le=255)
    signal: int | None = Field(ge=1, le=64)
    cpu_s: float = Field(ge=0, le=1e6)  # the agent's own figure: shown in logs at most, never charged
    oom_kills: int = Field(ge=-1, le=1 << 30)
    truncated: bool
    memory_error: bool


class ReadyRecord(BaseModel):
    """The supervisor's word after its cleanup: clean (reusable), or what was left behind."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    clean: bool
    problem: str | None = Field(max_length=200)


def _flat_record(raw: bytes, model: type[BaseModel]) -> BaseModel | None:
    # A valid record is one flat object whose strings are its own keys: one "{", no "[".
    # Refusing anything else before json.loads means no input can make the parser recurse.
    if len(raw) > _MAX_EXIT_RECORD or raw.count(b"{") != 1 or b"[" in raw:
        return None
    try:
        data = json.loads(raw)
        return model.model_validate(data) if isinstance(data, dict) else None
    except Exception:  # noqa: BLE001 - whatever the bytes do to the parser, it is the sandbox's fault
        return None


def parse_exit_record(raw: bytes) -> ExitRecord | None:
    """The record, or None for anything that is not exactly a valid one (never raises)."""
    record = _flat_record(raw, ExitRecord)
    return record if isinstance(record, ExitRecord) else None


def parse_ready_record(raw: bytes) -> ReadyRecord | None:
    record = _flat_record(raw, ReadyRecord)
    return record if isinstance(record, ReadyRecord) else None


@lru_cache(maxsize=1)
def agent_source() -> str:
    """The agent program passed as `python3 -c` to every sandbox."""
    return (Path(__file__).parent.parent / "inside" / "_agent.py").read_text(encoding="utf-8")


def encode_request(code: str, tier: Tier, *, tenant: str = "", as_bytes: int | None = None,
                   nproc: int | None = None, uid: int | None = None) -> bytes:
    body: dict[str, object] = {
        "code": code,
        "cpu_time_s": tier.cpu_time_s,
        "output_bytes": tier.output_bytes,
        "tenant": tenant,
    }
    if as_bytes:
        body["as_bytes"] = as_bytes
    if nproc:
        body["nproc"] = nproc
    if uid is not None:
        body["uid"] = uid
    # ensure_ascii: only printable bytes, never Docker's detach keys on the attached stdin.
    payload = json.dumps(body, ensure_ascii=True).encode("ascii")
    return str(len(payload)).encode("ascii") + b"\n" + payload


@dataclass
class FrameParser:
    """Feeds on the supervisor's stdout bytes for one execution; keeps at most `cap` bytes per stream.

    Output frames, then one exit record, then one ready record; nothing may follow.
    """

    cap: int
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit: ExitRecord | None = None
    ready: ReadyRecord | None = None
    truncated: bool = False
    protocol_error: str | None = None
    _head: bytearray = field(default_factory=bytearray)
    _kind: bytes = b""
    _left: int = 0
    _record_buf: bytearray = field(default_factory=bytearray)

    @property
    def over_cap(self) -> bool:
        return self.truncated

    def feed(self, data: bytes) -> None:
        try:
            self._feed(data)
        except Exception:  # noqa: BLE001 - a parser bug must not become the program's lever
            self.protocol_error = "unparseable frame stream"

    def _expected(self) -> tuple[bytes, ...]:
        return (b"1", b"2", b"X") if self.exit is None else (b"R",)

    def _feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.protocol_error is None:
            if self.ready is not None:
                self.protocol_error = "bytes after the ready record"
                return
            if self._left == 0:
                need = 5 - len(self._head)
                self._head += view[:need]
                view = view[need:]
                if len(self._head) < 5:
                    return
                self._kind = bytes(self._head[:1])
                self._left = struct.unpack(">I", self._head[1:5])[0]
                self._head.clear()
                if self._kind not in self._expected():
                    self.protocol_error = f"unexpected frame kind {self._kind!r} from the agent"
                    return
                if self._kind in (b"X", b"R") and not 0 < self._left <= _MAX_EXIT_RECORD:
                    self.protocol_error = "a record of the wrong size from the agent"
                    return
                continue
            take = view[: self._left]
            view = view[len(take):]
            self._left -= len(take)
            if self._kind in (b"X", b"R"):
                self._record_buf += take
                if self._left == 0:
                    self._end_record()
            else:
                buf = self.stdout if self._kind == b"1" else self.stderr
                room = self.cap - len(buf)
                if len(take) > room:
                    self.truncated = True
                    take = take[: max(room, 0)]
                buf += take

    def _end_record(self) -> None:
        raw = bytes(self._record_buf)
        self._record_buf.clear()
        if self._kind == b"X":
            self.exit = parse_exit_record(raw)
            if self.exit is None:
                self.protocol_error = "malformed exit record"
        else:
            self.ready = parse_ready_record(raw)
            if self.ready is None:
                self.protocol_error = "malformed ready record"


def decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExitInfo:
    """What the agent's exit record means under a tier's limits, checked against the host's CPU figure."""

    exit_code: int | None
    cpu_limited: bool = False
    killed_by_sigkill: bool = False
    memory_error: bool = False
    stderr_note: str = ""


def interpret_exit(record: ExitRecord, tier: Tier, host_cpu_s: float | None) -> ExitInfo:
    """Exit code as a shell reports it (128+signal), and which limit, if any, ended the program."""
    sig = record.signal
    if sig is None:
        return ExitInfo(exit_code=record.exit_code, memory_error=record.memory_error)
    # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (soft + 1s). The CPU figure
    # that decides is the host's; the agent's is used only where the host measured nothing.
    cpu = host_cpu_s if host_cpu_s is not None else record.cpu_s
    cpu_limited = sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= tier.cpu_time_s)
    return ExitInfo(
        exit_code=128 + sig, cpu_limited=cpu_limited,
        killed_by_sigkill=sig == signal.SIGKILL and not cpu_limited, memory_error=record.memory_error,
        stderr_note=f"\n[cpu time limit of {tier.cpu_time_s}s reached]" if cpu_limited else "",
    )
