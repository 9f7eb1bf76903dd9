"""Removing data: one run or batch at once (`DELETE /v1/runs/{id}`, `DELETE /v1/batches/{id}`), every
unfinished run of a batch cancelled (`reactq cancel --batch`, `POST /v1/batches/{id}/cancel`), and the
operator's sweep of finished runs and batches older than some age (`reactq purge --older-than 30d`).

Finished runs also expire on their own (their keys get a TTL when they finish); this is for removing
data before that. A run's keys are enumerated from its record and steps (no SCAN per run); the sweep
SCANs the keyspace twice (find the old runs, then delete every key of theirs), holding only the ids it
removes.

A batch's deletion and cancellation act only on the runs of the batch's tenant (its `tenant` field, the
one whose key may act on the batch through the API): a run of another tenant listed in the batch (a
batch made before batches were refused for naming several tenants) is left alone. A batch with no
tenant recorded is the operator's (the API never shows it): all its runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..core.models import Run
from ..store.run_keys import run_keys
from ..store.runs import RunStore
from .submit import cancel

__all__ = ["PurgeReport", "cancel_batch", "delete_batch", "delete_run", "parse_age", "purge"]

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.I)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds in `30d`, `12h`, `90m`, `45s`, `2w`; ValueError otherwise."""
    match = _AGE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an age like 30d, 12h, 90m, 45s or 2w")
    return float(match[1]) * _UNIT_S[match[2].lower()]


def delete_run(store: RunStore, run: Run) -> None:
    """Every key of the run, now. An unfinished run is cancelled first, so a step in flight stops."""
    if not run.status.finished:
        cancel(store, run.id)
    store.sweep.delete_keys(run.id, run_keys(store, run))


def _owned_runs(store: RunStore, batch_id: str) -> Iterator[Run | None]:
    """The batch's runs that its tenant owns (None for a run whose record is gone), in chunks."""
    owner = store.batches.info(batch_id).get("tenant")
    for chunk in store.batches.iter_run_ids(batch_id):
        for run in store.load_runs(chunk):
            if run is None or owner is None or run.spec.tenant == owner:
                yield run


def delete_batch(store: RunStore, batch_id: str) -> int:
    """The batch and all its tenant's runs; returns how many runs were removed."""
    removed = 0
    for run in _owned_runs(store, batch_id):
        if run is not None:
            delete_run(store, run)
            removed += 1
    store.batches.delete(batch_id)
    return removed


def cancel_batch(store: RunStore, batch_id: str, wake: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """Cancel every unfinished run of the batch's tenant in the batch; returns counts of `cancelled` and
    `already_finished`."""
    counts = {"cancelled": 0, "already_finished": 0}
    for run in _owned_runs(store, batch_id):
        if run is None or run.status.finished:
            counts["already_finished"] += 1
        elif (after := cancel(store, run.id, wake)) is not None and after.status.value == "cancelled":
            counts["cancelled"] += 1
    return counts


@dataclass(frozen=True)
class PurgeReport:
    runs: int
    keys: int
    batches: int


def purge(store: RunStore, older_than_s: float, now: float | None = None) -> PurgeReport:
    """Remove finished runs that finished more than `older_than_s` ago (every key of theirs), and batches
    created before then whose runs are all finished or gone. Unfinished runs are never touched. Holds
    only the ids it removes: the keyspace is scanned (store.sweep) once to find them, once to delete."""
    cutoff = (now or time.time()) - older_than_s
    old: set[str] = set()
    batch: list[str] = []

    def judge() -> None:
        for run_id, run in zip(batch, store.load_runs(batch), strict=True):
            if run is not None and run.status.finished and (run.finished_at or run.updated_at) < cutoff:
                old.add(run_id)
        batch.clear()

    for run_id in store.sweep.run_ids():
        batch.append(run_id)
        if len(batch) >= 500:
            judge()
    judge()
    removed_keys = store.sweep.delete_runs(old) if old else 0
    batches = 0
    for batch_id in store.sweep.batch_ids():
        info = store.batches.info(batch_id)
        if float(info.get("created_at", "inf")) >= cutoff:
            continue
        chunks = store.batches.iter_run_ids(batch_id)
        if all(run is None or run.status.finished for chunk in chunks for run in store.load_runs(chunk)):
            delete_batch(store, batch_id)
            batches += 1
    return PurgeReport(runs=len(old), keys=removed_keys, batches=batches)
