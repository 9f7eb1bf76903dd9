"""One-round-trip writes of a run record the step already holds: compare-and-set on the record's bytes.

A step reads the run record once (with its lease). Its later writes (running, waiting, the step
itself) send the bytes they read along with the new record and the commands that go with it; Redis
applies them only if the record is still exactly those bytes, in one script, so nobody can slip a
write in between. When the record did change (a cancel, most often), the store falls back to its
WATCH/MULTI transaction, which re-reads and re-decides. Both paths apply the same commands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from ..core.models import Run
from .scripts import lua

T = TypeVar("T")

Command = tuple[Any, ...]  # one Redis command and its arguments, e.g. ("RPUSH", key, value)

STREAM_LINGER_MS = 10_000  # a compacted run's event stream lingers this long (compact_function.lua)
# Each file's header says what it takes (KEYS, ARGV) and returns; the functions are prepended to the
# scripts that call them.
COMPACT_FUNCTION = lua(__file__, "compact_function.lua", STREAM_LINGER_MS=STREAM_LINGER_MS)
COMMANDS_FUNCTION = lua(__file__, "commands_function.lua")
COMPACT_SCRIPT = COMPACT_FUNCTION + lua(__file__, "compact_events.lua")
CAS_SCRIPT = COMPACT_FUNCTION + COMMANDS_FUNCTION + lua(__file__, "cas.lua")
RELEASE_LEASE = lua(__file__, "release_lease.lua")


@dataclass(frozen=True)
class Snapshot:
    """A run record and its bytes as this process last read or wrote them: the version a
    compare-and-set write expects."""

    run: Run
    raw: bytes


@dataclass(frozen=True)
class Written:
    """A run record as written, and the commands written with it and their replies, in order."""

    snapshot: Snapshot
    commands: list[Command]
    replies: list[Any]

    def reply_to(self, name: str, key: str) -> Any:
        """The reply to the first command `name` on `key` (None if there was none)."""
        for command, reply in zip(self.commands, self.replies, strict=True):
            if command[0] == name and command[1] == key:
                return reply
        return None


def cas_args(expected: bytes, new: bytes, lease_token: str | None, commands: list[Command],
             script_keys: list[str], compact: bool) -> list[Any]:
    """ARGV of cas.lua; the commands' keys are added to `script_keys` (its KEYS)."""
    return [expected, new, lease_token or "", int(compact), *script_commands(commands, script_keys)]


ALL_KEYS = frozenset({"DEL", "UNLINK", "EXISTS", "MGET"})  # commands whose arguments are all keys


def command_keys(command: Command) -> list[Any]:
    """The keys a command touches: every argument of ALL_KEYS' commands, else the first."""
    return list(command[1:]) if command[0] in ALL_KEYS else [command[1]]


def script_commands(commands: list[Command], script_keys: list[Any]) -> list[Any]:
    """Commands as a script's ARGV tail (commands_function.lua), their keys appended to `script_keys` (the
    script's KEYS) and named by their index there."""
    args: list[Any] = []
    index = {key: i for i, key in enumerate(script_keys, 1)}
    for command in commands:
        named = command_keys(command)
        positions = []
        for key in named:
            if key not in index:
                script_keys.append(key)
                index[key] = len(script_keys)
            positions.append(index[key])
        args += [len(command), len(named), command[0], *positions, *command[1 + len(named):]]
    return args


def run_commands(client: redis.Redis, commands: list[Command]) -> list[Any]:
    """Run these commands in one round trip (a pipeline, no transaction); their replies."""
    if not commands:
        return []
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute()


QueueWrites = Callable[[Any], Callable[[list[Any]], None] | None]


def write_watched(client: redis.Redis, key: str, decide: Callable[[bytes], tuple[T, QueueWrites] | None]) -> T | None:
    """A read-decide-write of one key in a WATCH/MULTI transaction, again whenever the key changed
    meanwhile. `decide` gets the stored bytes and returns what to give back and a function that queues
    the writes on the transaction (and may return one that takes the transaction's replies), or None
    to write nothing. None if the key is missing or nothing was written."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                stored = pipe.get(key)
                decided = decide(stored) if stored is not None else None
                if decided is None:
                    pipe.unwatch()
                    return None
                result, queue_writes = decided
                pipe.multi()
                on_replies = queue_writes(pipe)
                replies = pipe.execute()
                if on_replies is not None:
                    on_replies(replies)
                return result
            except redis.WatchError:
                continue
