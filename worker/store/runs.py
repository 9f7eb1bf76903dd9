"""The run record store: run records and their step traces, read, and written through one fenced write
(`RunStore.update_run`, compare-and-set or WATCH/MULTI: cas.py) that every change goes through: a step
recorded, a run running, waiting, ended, cancelled, approved, moved to a batch. A run's batch
(`.batches`), the recording of new runs (`.submissions`) and the purge's scans (`.sweep`) hang off it,
each in its own module; a step's scratch (scratch.py), leases (leases.py), the tool cache
(tool_cache.py) and once-only claims (claims.py) are modules of their own.

One mutator convention: a mutator changes the record it is given in place and returns a `Declined`
(DECLINED, or one with a reason) to leave it alone, or anything else to have it written; what it
returns comes back as `Updated.value` (None from a mutator with nothing more to say). Why this one: the
fence (is the run still at this step, unfinished) and what the change found (the approvals added, the
status a cancel ended, why a decision was refused) come from the one read inside the transaction, so
the mutator has to hand them back itself; a bare bool carries neither, and a value kept on the side is
stale when the watched path re-reads and calls the mutator again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import redis
from pydantic import TypeAdapter

from ..core.models import Run, RunStatus, Step, Uncounted
from . import keys, replicated
from .batches import BatchStore, batch_keys
from .cas import (
    CAS_SCRIPT,
    COMPACT_SCRIPT,
    RELEASE_LEASE,
    Command,
    QueueWrites,
    Snapshot,
    Written,
    cas_args,
    write_watched,
)
from .claims import Claims
from .connection import mget
from .events import event_command
from .outbox import OUTBOX_COMMANDS, Entry, Outbox, append_commands, split
from .scratch import StepScratch
from .spend import uncounted_commands, usage_commands
from .submissions import SubmissionStore
from .sweep import Sweep

T = TypeVar("T")

_STEPS = TypeAdapter(list[Step])

# An unfinished run's keys get their expiry again at most once in this long (RunStore._refresh_due).
REFRESH_EVERY_S = 3600

Trim = Callable[[], list[str]]  # a finished run's working keys, asked for only when a write finishes it

if TYPE_CHECKING:  # the engine (and its parser) is the step worker's: `reactq batch` does not load it
    from ..core.engine import End


@dataclass(frozen=True)
class Declined:
    """What a mutator returns to leave the run record alone, and why."""

    reason: str = ""


DECLINED = Declined()


@dataclass(frozen=True)
class Updated(Generic[T]):
    """What `RunStore.update_run` did: the record as written and the commands written with it (None: not
    written), and what the mutator returned (a `Declined`: it declined; None: no such run, or a mutator
    with nothing more to say)."""

    written: Written | None
    value: T | Declined | None

    @property
    def snapshot(self) -> Snapshot | None:
        return self.written.snapshot if self.written is not None else None

    @property
    def run(self) -> Run | None:
        return self.written.snapshot.run if self.written is not None else None


@dataclass(frozen=True)
class _Decided:
    """A mutated run record as it is to be written, the commands to write with it (on a cluster, those on
    the run's own shard, ending with its outbox's: `remote` went into it), whether its events are
    compacted after them (a write that finishes the run and drops its working keys), and whether these
    drop the run's lease (then the write need not release it)."""

    snapshot: Snapshot
    commands: list[Command]
    compact: bool
    remote: list[Command]
    drops_lease: bool = False

    @property
    def own(self) -> int:
        """How many of `commands` are the change's own (not the outbox's)."""
        return len(self.commands) - (OUTBOX_COMMANDS if self.remote else 0)


@dataclass(frozen=True)
class Committed:
    """A recorded step: the run record as stored, and how the step ended the run (None: it goes on).
    When it ended the run: whether the run's working keys went and its events were compacted with it,
    and, for a run of a batch, the batch's (finished runs, runs) as the step left them."""

    run: Run
    end: End | None
    trimmed: bool = False
    batch_progress: tuple[int, int] | None = None
    next_sent: bool = False  # the run goes on, and its next step's message went out with the step


def decode_steps(raws: list[bytes]) -> list[Step]:
    """A run's step list as stored (one JSON object per item), in one parse."""
    return _STEPS.validate_json(b"[" + b",".join(raws) + b"]") if raws else []


def start_deadline(run: Run, at: float) -> None:
    """Start the run's deadline clock at `at` (its first step's start), unless it runs already."""
    if run.deadline_at is None and run.deadline_s is not None:
        run.deadline_at = at + run.deadline_s


def advance(run: Run, step: Step, conclude: Callable[[Run], End | None], *, invalid: bool,
            uncounted: Uncounted | None = None) -> None:
    """Apply a recorded step to the run record (the record must be at `step.index`); `uncounted` is what
    of it the tenant's counters are to count when the run ends."""
    start_deadline(run, step.started_at)
    run.current_step = step.index + 1
    run.usage = run.usage + step.usage + step.lost_usage  # estimated, if lost_usage has any
    run.cost_usd += step.cost_usd
    if uncounted is not None:  # a new object: the record may be a shallow copy of a snapshot's
        run.uncounted = uncounted if run.uncounted is None else run.uncounted + uncounted
    run.waiting_on = None
    run.status = RunStatus.RUNNING
    run.invalid_streak = run.invalid_streak + 1 if invalid else 0
    end = conclude(run)
    if end is not None:
        run.status = end.status
        run.error = end.reason or None
        run.answer = step.final_answer
        run.output = step.output
        run.partial = step.best_effort and step.final_answer is not None
        run.finished_at = step.finished_at


class RunStore:
    def __init__(self, client: redis.Redis, run_ttl_s: int = 7 * 24 * 3600, retention_s: int = 30 * 24 * 3600, *,
                 wait_replicas: int = 1) -> None:
        self.r = client
        self.ttl = run_ttl_s  # every key of an unfinished run; refreshed as it moves (_commands)
        self.refresh_every = min(REFRESH_EVERY_S, run_ttl_s // 8)
        # What an unfinished run's keys are given when recorded and refreshed: two refresh periods to spare
        # (_refresh_due). A batch's keys get one (_on_finished).
        self.moving_ttl = run_ttl_s + 2 * self.refresh_every
        self.retention = retention_s  # a finished run's record, steps and events
        self.batch_ttl = max(run_ttl_s, retention_s)  # a batch outlives its runs, moving or finished
        self.batch_kept = self.batch_ttl + self.refresh_every
        self.batches = BatchStore(client, self.batch_kept)
        self._cas = client.register_script(CAS_SCRIPT)
        self._compact = client.register_script(COMPACT_SCRIPT)
        self.wait_replicas = wait_replicas  # on a cluster (replicated.py)
        self.submissions = SubmissionStore(client, self.moving_ttl, self.batch_kept, wait_replicas)
        self.sweep = Sweep(client)
        self.scratch = StepScratch(client, run_ttl_s)
        self.claims = Claims(client)
        self.on_cluster = keys.hash_tags()
        self.outbox = Outbox(client, wait_replicas)

    # --- run records -------------------------------------------------------------------------
    def load_run(self, run_id: str) -> Run | None:
        raw = self.r.get(keys.run(run_id))
        return Run.model_validate_json(raw) if raw else None

    def load_runs(self, run_ids: list[str]) -> list[Run | None]:
        if not run_ids:
            return []
        raws = mget(self.r, [keys.run(i) for i in run_ids])
        return [Run.model_validate_json(r) if r else None for r in raws]

    def copy_steps(self, run_id: str, steps: list[Step]) -> None:
        """Give a new run (a replay, before its first step is sent) the recorded steps it starts from."""
        if steps:
            pipe = self.r.pipeline(transaction=False)
            pipe.rpush(keys.steps(run_id), *[s.model_dump_json() for s in steps])
            pipe.expire(keys.steps(run_id), self.moving_ttl)
            pipe.execute()

    def drop_and_compact(self, run_id: str, names: list[str]) -> None:
        """Delete these keys of a finished run, and compact its event stream (cas.COMPACT_FUNCTION),
        in one round trip (one script: a pipeline holding a script would first ask the server whether
        it knows the script)."""
        self._compact(keys=[keys.events(run_id), keys.events_compacted(run_id), *names])

    def load_steps(self, run_id: str) -> list[Step]:
        return decode_steps(self.r.lrange(keys.steps(run_id), 0, -1))

    def update_run(
        self, run_id: str, mutate: Callable[[Run], T | Declined],
        extra: Callable[[Run, T], list[Command]] | None = None, *,
        expect: Snapshot | None = None, release_lease: str | None = None, trim: Trim | None = None,
    ) -> Updated[T]:
        """The one write of a run record: apply `mutate` to it atomically (a `Declined` leaves it alone),
        with the commands `extra` returns for the new record and `mutate`'s value, and release the lease
        held with `release_lease`, in one transaction. With `expect` (the record as this process last saw
        it) that is one compare-and-set round trip unless the record changed; else, and then, a WATCH/MULTI
        transaction that re-reads and re-decides. `trim` gives the run's working keys, dropped (and its
        events compacted) in the same transaction if this write finishes the run."""
        value: T | Declined | None = None

        def decide(run: Run, was_finished: bool) -> _Decided | None:
            nonlocal value  # the watched path may call it again: the last call's value is the one written
            before = (run.updated_at, run.current_step)
            value = returned = mutate(run)
            if isinstance(returned, Declined):
                return None
            run.updated_at = time.time()
            commands, compact = self._commands(run, was_finished, extra(run, returned) if extra else [], trim,
                                               refresh=self._refresh_due(run, *before))
            drops = compact and any(c[0] == "DEL" and keys.lease(run.id) in c[1:] for c in commands)
            remote: list[Command] = []
            if self.on_cluster:
                commands, remote = split(run_id, commands)
                if remote:
                    run.outbox_seq += 1
                    commands += append_commands(run_id, Entry(run.outbox_seq, remote, last=run.status.finished),
                                                self.moving_ttl)
            return _Decided(Snapshot(run, run.model_dump_json().encode()), commands, compact, remote, drops)

        written = None
        if expect is not None:
            decided = decide(expect.run.model_copy(), expect.run.status.finished)  # top-level fields only
            if decided is None:
                return Updated(None, value)  # the record only moves forward: a fence that says no on our copy says no
            written = self._compare_and_set(run_id, expect.raw, decided, release_lease)
        if written is None:
            written = self._write_watched(run_id, decide, release_lease)
        return Updated(written, value)

    def _written(self, run_id: str, d: _Decided, replies: list[Any]) -> Written:
        """The write as done: on a cluster, with its outbox applied (and the replies of its entry's part)."""
        if not d.remote:
            return Written(d.snapshot, d.commands, replies)
        applied = self.outbox.apply(run_id, replies[-1])
        remote_replies = applied.get(d.snapshot.run.outbox_seq, [None] * len(d.remote))
        return Written(d.snapshot, d.commands[:d.own] + d.remote, replies[:d.own] + remote_replies)

    def _compare_and_set(self, run_id: str, expected: bytes, d: _Decided, release_lease: str | None) -> Written | None:
        """Write the decided record if the stored one is still `expected` (cas.py); None if it is not."""
        script_keys = [keys.run(run_id), keys.lease(run_id), keys.events(run_id), keys.events_compacted(run_id)]
        lease = None if d.drops_lease else release_lease
        args = cas_args(expected, d.snapshot.raw, lease, d.commands, script_keys, d.compact)
        if self.on_cluster:  # acknowledged by a replica before the next step may read it (replicated.py)
            replies = replicated.run_script(self.r, self._cas, script_keys, args,  # type: ignore[arg-type]
                                            self.wait_replicas)
        else:
            replies = self._cas(keys=script_keys, args=args)
        return self._written(run_id, d, replies) if replies != 0 else None

    def _write_watched(self, run_id: str, decide: Callable[[Run, bool], _Decided | None],
                       release_lease: str | None) -> Written | None:
        key = keys.run(run_id)

        def on_stored(stored: bytes) -> tuple[tuple[_Decided, list[Any]], QueueWrites] | None:
            run = Run.model_validate_json(stored)
            d = decide(run, run.status.finished)
            if d is None:
                return None
            replies: list[Any] = []
            lease = None if d.drops_lease else release_lease

            def writes(pipe: Any) -> Callable[[list[Any]], None]:
                pipe.set(key, d.snapshot.raw, keepttl=True)
                if lease:
                    pipe.execute_command("EVAL", RELEASE_LEASE, 1, keys.lease(run_id), lease)
                for command in d.commands:
                    pipe.execute_command(*command)
                if d.compact:
                    pipe.execute_command("EVAL", COMPACT_SCRIPT, 2, keys.events(run_id), keys.events_compacted(run_id))
                first = 1 + bool(lease)
                return lambda results: replies.extend(results[first:first + len(d.commands)])

            return (d, replies), writes

        done = write_watched(self.r, key, on_stored)
        return self._written(run_id, *done) if done is not None else None

    def _refresh_due(self, run: Run, updated_at: float, current_step: int) -> list[str]:
        """The keys of an unfinished run whose expiry this write refreshes (the stored record was written
        at `updated_at`, at `current_step`): all of them on the run's first write in each
        `refresh_every` period, else its step list when this write makes it (records its first step).
        Recorded and refreshed, they get `moving_ttl`, two periods more than the TTL, so they still outlive
        the TTL after the run's last write: the submission or the refresh before it was at most one period
        earlier (and a period more for another worker's clock)."""
        if updated_at // self.refresh_every != run.updated_at // self.refresh_every:
            return [keys.run(run.id), keys.steps(run.id), keys.events(run.id)]
        return [keys.steps(run.id)] if current_step == 0 != run.current_step else []

    def _commands(self, run: Run, was_finished: bool, extra: list[Command],
                  trim: Trim | None = None, *, refresh: list[str] | None = None) -> tuple[list[Command], bool]:
        """The writes that go with a new run record: `extra`'s, then the active set and the end of a run,
        and the expiry of the keys the run keeps (`refresh`: _refresh_due's). (Its batch's keys get theirs
        as its runs are submitted and as they finish: the batch outlives them.) And whether the run's
        events are to be compacted after them: a write that finishes the run, given its working keys."""
        commands = list(extra)
        compact = False
        if run.status.finished and not was_finished:
            commands += self._on_finished(run, taken_too=trim is None)
            if trim is not None:  # the working keys (the lease among them) and the reaper's taken marker
                commands.append(("DEL", *trim(), keys.step_taken(run.id)))
                compact = True
        elif not run.status.finished:
            commands.append(("ZADD", keys.active_runs(run.id), run.updated_at, run.id))
            commands += [("EXPIRE", key, self.moving_ttl) for key in refresh or []]
        return commands, compact

    def _batch_keys_due(self, run: Run) -> tuple[str, ...]:
        """The keys of a finishing run's batch whose expiry its end refreshes, so that the batch outlives
        the run's record: all of them, unless the run joined the batch less than a refresh period ago.
        Then only its finished list (which this end may make) and its webhook marker: the others were
        given `batch_kept` (a period more than `batch_ttl`) when the run was submitted into it or moved to
        it, and every later expiry of them gives as much."""
        batch_id = run.spec.batch_id
        assert batch_id is not None
        if run.updated_at - run.created_at < self.refresh_every:
            return keys.batch_done(batch_id), keys.batch_webhook_sent(batch_id)
        return batch_keys(batch_id)

    def _on_finished(self, run: Run, *, taken_too: bool = True) -> list[Command]:
        finished = json.dumps({"status": run.status.value, "answer": run.answer})
        commands: list[Command] = [
            ("ZREM", keys.active_runs(run.id), run.id),
            ("SREM", keys.tenant_inflight(run.spec.tenant), run.id),
            event_command(run.id, "finished", finished),
        ]
        if run.uncounted is not None:
            commands += uncounted_commands(run.spec.tenant, run.uncounted, run.finished_at or run.updated_at)
        if taken_too:  # (else deleted with the working keys)
            commands.append(("DEL", keys.step_taken(run.id)))
        commands += [("EXPIRE", key, self.retention)
                     for key in (keys.run(run.id), keys.steps(run.id), keys.events(run.id))]
        if run.spec.batch_id:  # the RPUSH and LLEN replies are the batch's progress (finished runs, runs)
            commands += [("RPUSH", keys.batch_done(run.spec.batch_id), run.id),
                         ("LLEN", keys.batch_runs(run.spec.batch_id)),
                         ("HINCRBY", keys.batch(run.spec.batch_id), keys.BATCH_STATUS_FIELD + run.status.value, 1)]
            if run.usage.total or run.cost_usd:  # the batch counts its runs' usage as they end
                commands += usage_commands(keys.batch(run.spec.batch_id), run.usage, run.cost_usd)
            commands += [("EXPIRE", key, self.batch_kept) for key in self._batch_keys_due(run)]
        return commands

    def commit_step(
        self, snapshot: Snapshot, step: Step, conclude: Callable[[Run], End | None], *, invalid: bool = False,
        release_lease: str | None = None, also: list[Command] | None = None, trim: Trim | None = None,
        send_next: Callable[[], list[Command]] | None = None, uncounted: Uncounted | None = None,
    ) -> Committed | None:
        """Record step `step.index` and advance the run, only if the run is still at that step, adding
        `uncounted` to what the run's end counts on its tenant.
        `conclude` (pure) says whether the advanced record ends the run, and how. The lease held with
        `release_lease` is let go, and the `also` writes are made, in the same transaction; if the run
        goes on, so are the `send_next` commands (the next step's message); if the step ends the run,
        its working keys `trim` are dropped and its events compacted."""
        run_id = snapshot.run.id

        def mutate(run: Run) -> Declined | None:
            if run.status.finished or run.current_step != step.index:
                return DECLINED
            advance(run, step, conclude, invalid=invalid, uncounted=uncounted)
            return None

        def extra(run: Run, _: None) -> list[Command]:
            data = step.model_dump_json()
            going_on = send_next() if send_next is not None and not run.status.finished else []
            # the event names the step by its index: the step itself is in the list (the stream's reader reads it)
            return [("RPUSH", keys.steps(run_id), data), event_command(run_id, "step", str(step.index)),
                    *(also or []), *going_on]

        written = self.update_run(run_id, mutate, extra, expect=snapshot, release_lease=release_lease,
                                  trim=trim).written
        if written is None:
            return None
        run = written.snapshot.run
        end = conclude(run)
        if not run.status.finished:
            return Committed(run, end, next_sent=send_next is not None)
        progress = None
        if run.spec.batch_id is not None:
            finished = written.reply_to("RPUSH", keys.batch_done(run.spec.batch_id))
            progress = int(finished), int(written.reply_to("LLEN", keys.batch_runs(run.spec.batch_id)))
        return Committed(run, end, trimmed=trim is not None, batch_progress=progress)

    def finish(self, run_id: str, status: RunStatus, reason: str, *, only_step: int | None = None) -> Run | None:
        """End a run without recording a step (a limit, an LLM failure, a cancel)."""

        def mutate(run: Run) -> Declined | None:
            if run.status.finished or (only_step is not None and run.current_step != only_step):
                return DECLINED
            run.status = status
            run.error = reason or None
            run.finished_at = time.time()
            return None

        return self.update_run(run_id, mutate).run

    def mark_cancel_recorded(self, run_id: str) -> Run | None:
        """Note that a worker has counted this run's cancellation; the run if this call was the first."""

        def mutate(run: Run) -> Declined | None:
            if run.cancel_recorded:
                return DECLINED
            run.cancel_recorded = True
            return None

        return self.update_run(run_id, mutate).run

    def mark_running(self, snapshot: Snapshot, step_index: int, waiting_on: str | None = None,
                     started_at: float | None = None, release_lease: str | None = None,
                     also: list[Command] | None = None) -> Snapshot | None:
        """Running (and, on its first step, its deadline clock started, at `started_at` or now), or waiting on
        something; the lease held with `release_lease` is let go, and the `also` writes made, in the same
        write (neither when declined)."""

        def mutate(run: Run) -> Declined | None:
            if run.status.finished or run.current_step != step_index:
                return DECLINED
            start_deadline(run, started_at or time.time())
            run.status = RunStatus.RUNNING
            run.waiting_on = waiting_on
            return None

        return self.update_run(snapshot.run.id, mutate, (lambda run, _: also) if also else None, expect=snapshot,
                               release_lease=release_lease).snapshot

    # --- a run's batch ----------------------------------------------------------------------------
    def move_to_batch(self, run_id: str, batch_id: str) -> None:
        """Make a run submitted by an earlier invocation part of `batch_id`: listed in it, and its end
        pushed to the batch's finished list (at once, if it has ended or its record is gone)."""

        def mutate(run: Run) -> Declined | None:
            if run.status.finished:
                return DECLINED
            run.spec.batch_id = batch_id
            return None

        moved = self.update_run(run_id, mutate).run
        ended = self.load_run(run_id) if moved is None else None
        pipe = self.r.pipeline(transaction=False)
        pipe.rpush(keys.batch_runs(batch_id), run_id)
        for key in batch_keys(batch_id):  # (a run that joined a batch just now leaves these to it: _batch_keys_due)
            pipe.expire(key, self.batch_kept)
        if moved is None:
            pipe.rpush(keys.batch_done(batch_id), run_id)
            if ended is not None:
                pipe.hincrby(keys.batch(batch_id), keys.BATCH_STATUS_FIELD + ended.status.value, 1)
        pipe.execute()
