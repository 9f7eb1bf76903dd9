"""On a Redis Cluster, the writes of a run-record change that fall outside the run's shard.

A run's keys share its hash tag, so its commit stays one atomic script on one shard. What it also wrote on
a single Redis (the active set, the tenant's usage and spend, its batch's counters) lives on other shards,
where no script of the run's shard may reach. The commit therefore appends those commands to the run's
outbox (a list in its own slot, in the same script), and whoever wrote it applies the outbox right after;
a worker that dies in between leaves the outbox to the run's next write or to the reaper (a run with
anything in its outbox stays in the active set: its removal from it is applied last).

Each entry carries the run record's `outbox_seq` (the record's history is linear, so the numbers are), and
each shard applies an entry's commands at most once: a marker hash in the commands' own slot remembers the
last entry applied there per run while it runs, and an end marker (END_MARKER_TTL_S) refuses its entries
once its last one is applied there. Replies to an entry applied elsewhere already are None.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from redis.crc import key_slot

from . import keys, replicated
from .cas import COMMANDS_FUNCTION, Command, script_commands
from .scripts import lua

APPLY_SCRIPT = COMMANDS_FUNCTION + lua(__file__, "apply_outbox.lua")
MARKER_TTL_S = 7 * 24 * 3600  # a marker outlives any run that left entries in it unfinished
# A finished run's entries are refused for this long after its last one was applied: longer than any writer
# holds an entry it read (its commit's reply) before applying it, retries through a failover included (the
# client's patience, 30 s). One small key per run and shard meanwhile: about runs/s x 120 keys on the shards
# of a busy batch and tenant (bench/redis_shards.py saw 600 s of them make half of a shard's keys).
END_MARKER_TTL_S = 120


def slot_of(key: str | bytes) -> int:
    return key_slot(key.encode() if isinstance(key, str) else key)


def split(run_id: str, commands: list[Command]) -> tuple[list[Command], list[Command]]:
    """The commands the commit makes on the run's own slot, and those its outbox holds, each keeping its
    order: the others, and with them the run's removal from its active set (in its own slot), so that the
    run leaves the reaper's view only once the rest is applied."""
    home = slot_of(keys.run(run_id))
    local = [c for c in commands if slot_of(c[1]) == home]
    remote = [c for c in commands if slot_of(c[1]) != home]
    if remote:
        remote += [c for c in local if _leaves_active(c)]
        local = [c for c in local if not _leaves_active(c)]
    return local, remote


def _leaves_active(command: Command) -> bool:
    return command[0] == "ZREM" and keys.is_active_set(command[1])


@dataclass(frozen=True)
class Entry:
    seq: int
    commands: list[Command]
    last: bool  # the run's final entry: its markers forget the run

    def encode(self) -> str:
        return json.dumps([self.seq, self.last, [list(c) for c in self.commands]])

    @staticmethod
    def decode(raw: bytes | str) -> Entry:
        seq, last, commands = json.loads(raw)
        return Entry(int(seq), [tuple(c) for c in commands], bool(last))


OUTBOX_COMMANDS = 3  # how many commands `append_commands` adds to a commit


def append_commands(run_id: str, entry: Entry, ttl_s: int) -> list[Command]:
    """The commit's own commands that put `entry` in the run's outbox (it lives as long as the run's keys)
    and read back everything there (what the writer then applies: the last reply)."""
    box = keys.outbox(run_id)
    return [("RPUSH", box, entry.encode()), ("EXPIRE", box, ttl_s), ("LRANGE", box, 0, -1)]


def marker(key: str) -> str:
    """The applied-marker hash in `key`'s slot: named by the key's hash tag, or by the whole key."""
    start = key.find("{")
    end = key.find("}", start + 1)
    tag = key[start + 1:end] if start != -1 and end > start + 1 else key
    return f"{keys.PREFIX}:applied:{{{tag}}}"


def end_marker(key: str, run_id: str) -> str:
    """Beside `marker(key)`: set once the run's last entry was applied in that slot."""
    return f"{marker(key)}:end:{run_id}"


def _by_slot(indexed: list[tuple[int, Command]]) -> list[list[tuple[int, Command]]]:
    """Commands (with their index) grouped by slot, in the order their slots first appear."""
    by_slot: dict[int, list[tuple[int, Command]]] = {}
    for i, command in indexed:
        by_slot.setdefault(slot_of(command[1]), []).append((i, command))
    return list(by_slot.values())


class Outbox:
    def __init__(self, client: redis.Redis, wait_replicas: int = 1) -> None:
        self.r = client
        self.wait_replicas = wait_replicas  # each shard's part acknowledged by its replicas (replicated.py)
        self._apply = client.register_script(APPLY_SCRIPT)

    def apply(self, run_id: str, raws: Iterable[bytes]) -> dict[int, list[Any]]:
        """Apply these entries of the run's outbox in order, each slot's part at most once, then drop them from
        the outbox and apply their active-set parts (the run's own slot: one pipeline after the LREMs), so a
        run leaves the active set (where the reaper looks for outboxes to apply) last. The replies of each
        entry by sequence number (None: applied before)."""
        replies: dict[int, list[Any]] = {}
        drops: list[Command] = []
        active: list[tuple[list[Any], list[tuple[int, Command]]]] = []
        for raw in raws:
            entry = Entry.decode(raw)
            got: list[Any] = [None] * len(entry.commands)
            indexed = list(enumerate(entry.commands))
            active.append((got, [(i, c) for i, c in indexed if keys.is_active_set(c[1])]))
            for group in _by_slot([(i, c) for i, c in indexed if not keys.is_active_set(c[1])]):
                self._fill(got, group, self._apply_once(run_id, entry, [c for _, c in group]))
            replies[entry.seq] = got
            drops.append(("LREM", keys.outbox(run_id), 1, raw))
        if drops:  # then the ZREMs: applied again, nothing the reaper does not mend
            moves = [c for _, group in active for _, c in group]
            done = iter(replicated.run_commands(self.r, drops + moves, self.wait_replicas)[len(drops):])  # type: ignore[arg-type]
            for got, group in active:
                self._fill(got, group, [next(done) for _ in group])
        return replies

    @staticmethod
    def _fill(got: list[Any], group: list[tuple[int, Command]], result: Any) -> None:
        if result != 0:
            for (i, _), reply in zip(group, result, strict=True):
                got[i] = reply

    def _apply_once(self, run_id: str, entry: Entry, commands: list[Command]) -> Any:
        first = str(commands[0][1])
        key_names = [marker(first), end_marker(first, run_id)]
        args = [run_id, entry.seq, int(entry.last), MARKER_TTL_S, END_MARKER_TTL_S,
                *script_commands(commands, key_names)]
        return replicated.run_script(self.r, self._apply, key_names, args, self.wait_replicas)  # type: ignore[arg-type]

    def drain(self, run_id: str) -> int:
        """Apply whatever the run's outbox holds (a writer died before it did); how many entries."""
        raws = self.r.lrange(keys.outbox(run_id), 0, -1)
        self.apply(run_id, raws)
        return len(raws)
