"""`reactq batch`: stream a JSONL file in, submit what is missing from the output file in chunks, and
write each result as its run finishes. Memory stays flat in the batch's size: the lines are read once
for duplicate ids (8 bytes each) and once to submit; results are followed through the batch's
finished-runs list in Redis (a cursor), with one 64-bit digest per written result to skip repeats.

A rerun for the same output file may adopt the runs of the earlier invocation (the last batch for that
file) instead of submitting its lines anew:
- an unfinished run is adopted: it is still working on that line, and a second run would spend twice;
- a finished run is adopted only if the earlier invocation was interrupted before writing its result
  (the batch records how many results it wrote, and when it wrote them all). A result it did write and
  the output file no longer holds was removed by the user (a deleted file means "start over"): that
  line is submitted anew, as is every line of an earlier invocation that completed;
- `fresh=True` (`--fresh`) adopts nothing.
What was adopted, and in which states, is reported (`Submitted.earlier`), never silent."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Settings
from ..core.models import Run, RunSpec
from ..errors import AdmissionRefused, InvalidRequest
from ..store.runs import RunStore
from ..tenancy.budgets import TenantBudgets
from ..tenancy.tenants import Tenants
from .batch_input import IdSet, LineError, ParsedLine, digest, finished_ids
from .submit import new_batch_id, submit

__all__ = ["BatchRunner", "Earlier", "Follower", "Progress", "Submitted", "SUBMIT_CHUNK"]

SUBMIT_CHUNK = 500
READ_CHUNK = 1000
LOST_AFTER_S = 10.0


@dataclass
class Progress:
    total: int
    done: int = 0
    failed: int = 0
    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    lost: int = 0  # runs whose records vanished from Redis (a Redis that lost data)


@dataclass
class Earlier:
    """The earlier invocation for the same output file, and what this one took from it."""

    batch_id: str
    complete: bool  # it wrote every result: none of its runs is adopted
    fresh: bool  # `--fresh`: none of its runs is adopted
    written: IdSet  # runs whose results it wrote: finished ones of these are not adopted
    unfinished: int  # its runs still going when this invocation started (as its lists count them)
    adopted: Counter[str] = field(default_factory=Counter)  # run status -> runs adopted
    resubmitted: int = 0  # its finished runs whose lines are submitted anew

    def may_adopt(self, run: Run) -> bool:
        if self.fresh:
            return False
        return not run.status.finished or (not self.complete and run.id not in self.written)


@dataclass(frozen=True)
class Submitted:
    batch_id: str
    total: int  # runs to follow: submitted now, or adopted from an interrupted invocation
    skipped: int  # lines already in the output file
    errors: int  # lines rejected
    earlier: Earlier | None = None  # the earlier invocation for the same output file, if any


class BatchRunner:
    """Submits a batch and follows it to the end, handing over each run as it finishes."""

    def __init__(self, store: RunStore, settings: Settings, send_step: Callable[..., None],
                 tenants: Tenants, budgets: TenantBudgets, on_wait: Callable[[AdmissionRefused], None] | None = None,
                 send_together: Callable[[], AbstractContextManager[Callable[..., None]]] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.send_step = send_step
        self.send_together = send_together  # with it, each chunk's first steps go out in one round trip
        self.on_wait = on_wait  # told before waiting out an admission refusal (runs in flight, per minute)
        self.tenants = tenants  # chunks are no larger than a tenant's plan admits at once
        self.budgets = budgets
        self._chunk_limits: dict[str, int] = {}

    def start(self, lines: Iterable[ParsedLine | LineError], out_path: Path, on_error: Callable[[LineError], None],
              after_chunk: Callable[[str, int], None] | None = None, fresh: bool = False) -> Submitted:
        """Submit, chunk by chunk, the lines whose ids are missing from the output file, adopting runs
        of the earlier invocation for the same output file as the module's docstring says. Every line is
        of one tenant (InvalidRequest otherwise). `after_chunk(batch id, runs so far)` runs after each
        chunk (results can be written while the rest is submitted)."""
        file_digest = hashlib.sha256(str(out_path.resolve()).encode()).hexdigest()[:24]
        done = finished_ids(out_path)
        previous = self.store.batches.for_file(file_digest)
        earlier = self._earlier(previous, fresh) if previous else None
        batch_id = new_batch_id()
        self.store.batches.create(batch_id, {"out": str(out_path), "submitting": "1"})
        self.store.batches.set_for_file(file_digest, batch_id)  # now: an interruption mid-way is adopted
        total = skipped = errors = 0
        chunk: list[RunSpec] = []
        limit = SUBMIT_CHUNK
        owner: str | None = None
        for item in lines:
            if isinstance(item, LineError):
                on_error(item)
                errors += 1
                continue
            owner = owner or item.spec.tenant
            if item.spec.tenant != owner:  # iter_input refuses such a file first; this holds for any caller
                raise InvalidRequest(f"line {item.spec.client_id!r} belongs to tenant {item.spec.tenant!r} and the "
                                     f"batch to tenant {owner!r}: a batch is one tenant's")
            if item.spec.client_id in done:
                skipped += 1
            else:
                chunk.append(item.spec)
                limit = min(limit, self._chunk_limit(item.spec.tenant))
                if len(chunk) >= limit:
                    total += self._submit_chunk(chunk, batch_id, earlier)
                    chunk = []
                    if after_chunk is not None:
                        after_chunk(batch_id, total)
        if chunk:
            total += self._submit_chunk(chunk, batch_id, earlier)
        self.store.batches.mark_submitted(batch_id, total)
        return Submitted(batch_id, total, skipped, errors, earlier)

    def _earlier(self, batch_id: str, fresh: bool) -> Earlier | None:
        info = self.store.batches.info(batch_id)
        if not info:
            return None  # expired
        finished, size = self.store.batches.progress(batch_id)
        complete = "complete" in info
        written = IdSet(() if complete or fresh else self.store.batches.written_ids(batch_id))
        return Earlier(batch_id, complete, fresh, written, unfinished=max(0, size - finished))

    def _chunk_limit(self, tenant: str) -> int:
        """A chunk no plan involved refuses for its size alone (runs in flight, submissions per minute)."""
        if tenant not in self._chunk_limits:
            policy = self.tenants.policy(tenant)
            limits = policy.plan.limits if policy is not None else None
            self._chunk_limits[tenant] = (SUBMIT_CHUNK if limits is None else
                                          max(1, min(SUBMIT_CHUNK, limits.runs_in_flight,
                                                     limits.submissions_per_minute)))
        return self._chunk_limits[tenant]

    def _submit_admitted(self, chunk: list[RunSpec], batch_id: str) -> list[Run]:
        """Submit, waiting out admission refusals (the tenant's runs in flight, submissions per minute)."""
        while True:
            try:
                with self.send_together() if self.send_together else nullcontext(self.send_step) as send:
                    return submit(self.store, chunk, self.settings, send, batch_id=batch_id, tenants=self.tenants,
                                  budgets=self.budgets)
            except AdmissionRefused as exc:
                if self.on_wait is not None:
                    self.on_wait(exc)
                time.sleep(exc.retry_after_s)

    def _submit_chunk(self, specs: list[RunSpec], batch_id: str, earlier: Earlier | None) -> int:
        adopted: dict[str, str] = {}
        if earlier is not None:
            old = self.store.batches.run_ids_of(earlier.batch_id, [s.client_id or "" for s in specs])
            for spec, run in zip(specs, self.store.load_runs(old), strict=True):
                if run is None or run.spec.question != spec.question or run.spec.tenant != spec.tenant:
                    continue
                if not earlier.may_adopt(run):
                    earlier.resubmitted += run.status.finished
                    continue
                earlier.adopted[run.status.value] += 1
                adopted[spec.client_id or ""] = run.id
                self.store.move_to_batch(run.id, batch_id)
        self.store.batches.claim_owner(batch_id, specs[0].tenant)
        fresh = [s for s in specs if s.client_id not in adopted]
        runs = self._submit_admitted(fresh, batch_id) if fresh else []
        mapping = {**adopted, **{run.spec.client_id or "": run.id for run in runs}}
        self.store.batches.record_ids(batch_id, mapping)
        return len(mapping)

    def follow(
        self, run_ids: list[str], on_finished: Callable[[Run], None], on_tick: Callable[[Progress], None],
        poll_s: float = 0.25, timeout_s: float | None = None,
    ) -> Progress:
        """Follow a few runs outside a batch (`reactq ask --wait`)."""
        progress = Progress(total=len(run_ids))
        pending = set(run_ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            for run_id, run in zip(sorted(pending), self.store.load_runs(sorted(pending)), strict=True):
                if run is None or run.status.finished:
                    pending.discard(run_id)
                    if run is None:
                        progress.lost += 1
                        continue
                    progress.done += 1
                    on_finished(run)
            on_tick(progress)
            if pending:
                if deadline is not None and time.monotonic() > deadline:
                    break
                time.sleep(poll_s)
        return progress


class Follower:
    """Hands over each run of a batch as it finishes, in the order they finished: the batch's
    finished-runs list read with a cursor, and one 64-bit digest per run handed over (to skip repeats)."""

    def __init__(self, store: RunStore, on_finished: Callable[[Run], None]) -> None:
        self.store = store
        self.on_finished = on_finished
        self.progress = Progress(total=0)
        self._cursor = 0
        self._written: set[int] = set()

    def drain(self, batch_id: str) -> int:
        """Hand over what has finished by now; returns how many runs that was."""
        before = self.progress.done + self.progress.lost
        cursor = self._cursor
        while ids := self.store.batches.finished_range(batch_id, self._cursor, READ_CHUNK):
            self._hand_over(ids)
            self._cursor += len(ids)
        if self._cursor != cursor:  # a rerun adopts no finished run whose result was written
            self.store.batches.mark_written(batch_id, self._cursor)
        if self.store.batches.finished_count(batch_id) < self._cursor:  # Redis lost the list's tail: read it again
            self._cursor = 0
        return self.progress.done + self.progress.lost - before

    def follow(self, batch_id: str, total: int, on_tick: Callable[[Progress], None], poll_s: float = 0.25,
               timeout_s: float | None = None) -> Progress:
        """Until all `total` runs of the batch have been handed over (or reported lost)."""
        progress = self.progress
        progress.total = total
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stalled_since = time.monotonic()
        while progress.done + progress.lost < total:
            if self.drain(batch_id):
                stalled_since = time.monotonic()
            on_tick(progress)
            if progress.done + progress.lost >= total:
                break
            if time.monotonic() - stalled_since > LOST_AFTER_S:
                stalled_since = time.monotonic()
                if self._unfinished(batch_id) == 0 and not self.drain(batch_id):
                    progress.lost = total - progress.done  # nothing left that could still finish
                    break
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        if progress.done + progress.lost >= total:
            self.store.batches.mark_complete(batch_id)
        return progress

    def _hand_over(self, ids: list[str]) -> None:
        progress = self.progress
        for run_id, run in zip(ids, self.store.load_runs(ids), strict=True):
            mark = digest(run_id)
            if mark in self._written:
                continue
            self._written.add(mark)
            if run is None:
                progress.lost += 1
                continue
            progress.done += 1
            progress.failed += run.status.value != "succeeded"
            progress.steps += run.current_step
            progress.tokens += run.usage.total
            progress.cost_usd += run.cost_usd
            self.on_finished(run)

    def _unfinished(self, batch_id: str) -> int:
        """Runs of the batch whose records exist and have not finished (a pass over the batch, in chunks)."""
        return sum(run is not None and not run.status.finished
                   for chunk in self.store.batches.iter_run_ids(batch_id) for run in self.store.load_runs(chunk))
