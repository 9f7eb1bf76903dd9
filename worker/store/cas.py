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

T = TypeVar("T")

Command = tuple[Any, ...]  # one Redis command and its arguments, e.g. ("RPUSH", key, value)

STREAM_LINGER_MS = 10_000
# A finished run's event stream compacted into one small JSON string (same entry ids, same TTL) whose
# `step` events point at the step list instead of repeating each step's text (a stream costs ~4 KB
# however few its entries). The stream itself expires STREAM_LINGER_MS later instead of going at once:
# a subscriber blocked reading it is served only if the stream still exists when the script ends, and
# one that read no compacted string a moment ago reads the stream next.
COMPACT_FUNCTION = """
local function compact(stream, compacted)
  local ttl = redis.call('PTTL', stream)
  local entries = redis.call('XRANGE', stream, '-', '+')
  if #entries == 0 then return 0 end
  local out = {}
  for _, entry in ipairs(entries) do
    local fields, kind, data = entry[2], nil, nil
    for i = 1, #fields, 2 do
      if fields[i] == 'type' then kind = fields[i + 1] elseif fields[i] == 'data' then data = fields[i + 1] end
    end
    if kind == 'step' and data then
      table.insert(out, {entry[1], kind, cjson.decode(data)['index']})
    else
      table.insert(out, {entry[1], kind, data or '{}'})
    end
  end
  redis.call('SET', compacted, cjson.encode(out))
  if ttl > 0 then redis.call('PEXPIRE', compacted, ttl) end
  redis.call('PEXPIRE', stream, """ + str(STREAM_LINGER_MS) + """)
  return #entries
end
"""

# KEYS: the events stream, the compacted string, then any keys to delete first.
COMPACT_SCRIPT = COMPACT_FUNCTION + """
if #KEYS > 2 then redis.call('DEL', unpack(KEYS, 3)) end
return compact(KEYS[1], KEYS[2])
"""

# Runs the commands that script_commands() encoded into ARGV from index `first` on; their replies.
COMMANDS_FUNCTION = """
local function run_commands(first)
  local replies = {}
  local i = first
  while i <= #ARGV do
    local n = tonumber(ARGV[i])
    replies[#replies + 1] = redis.call(unpack(ARGV, i + 1, i + n))
    i = i + n + 1
  end
  return replies
end
"""

# KEYS: run record, lease, and (a write that finishes the run) its events stream and compacted events,
# compacted after the commands. ARGV: expected bytes, new bytes, lease token ("" = keep the lease), then
# the commands (script_commands). Returns 0 if the record was not the expected bytes, else each
# command's reply.
CAS_SCRIPT = COMPACT_FUNCTION + COMMANDS_FUNCTION + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
local replies = run_commands(4)
if #KEYS == 4 then compact(KEYS[3], KEYS[4]) end
return replies
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


def cas_args(expected: bytes, new: bytes, lease_token: str | None, commands: list[Command]) -> list[Any]:
    return [expected, new, lease_token or "", *script_commands(commands)]


def script_commands(commands: list[Command]) -> list[Any]:
    """Commands as a script's ARGV tail: each as its argument count followed by its arguments."""
    args: list[Any] = []
    for command in commands:
        args.append(len(command))
        args.extend(command)
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
                on_replies = queue_writes(pipe)
                replies = pipe.execute()
                if on_replies is not None:
                    on_replies(replies)
                return result
            except redis.WatchError:
                continue
