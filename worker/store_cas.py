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

from .core.models import Run

T = TypeVar("T")

Command = tuple[Any, ...]  # one Redis command and its arguments, e.g. ("RPUSH", key, value)

# KEYS: run record, lease. ARGV: expected bytes, new bytes, lease token ("" = keep the lease), then
# each command as its argument count followed by its arguments.
CAS_SCRIPT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return 1
"""

RELEASE_LEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


@dataclass(frozen=True)
class Snapshot:
    """A run record and its bytes as this process last read or wrote them: the version a
    compare-and-set write expects."""

    run: Run
    raw: bytes


def cas_args(expected: bytes, new: bytes, lease_token: str | None, commands: list[Command]) -> list[Any]:
    args: list[Any] = [expected, new, lease_token or ""]
    for command in commands:
        args.append(len(command))
        args.extend(command)
    return args


def run_commands(client: redis.Redis, commands: list[Command]) -> None:
    """Run these writes in one round trip (a pipeline, no transaction)."""
    if commands:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        pipe.execute()


def write_watched(client: redis.Redis, key: str,
                  decide: Callable[[bytes], tuple[T, Callable[[Any], None]] | None]) -> T | None:
    """A read-decide-write of one key in a WATCH/MULTI transaction, again whenever the key changed
    meanwhile. `decide` gets the stored bytes and returns what to give back and a function that queues
    the writes on the transaction, or None to write nothing. None if the key is missing or nothing
    was written."""
    with client.pipeline() as pipe:
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
                queue_writes(pipe)
                pipe.execute()
                return result
            except redis.WatchError:
                continue
