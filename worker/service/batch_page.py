"""What the UI's batch pages show: a tenant's (or every tenant's) recent batches, one batch's figures with
its slowest and failed runs, and its results as the JSONL `reactq batch --out` writes.

A batch's figures come from `batch_view` (a few reads whatever its size). The slowest and failed runs
need the runs themselves: their records are read in chunks along the batch's finished list, at most
`scan_limit` of them (the page says how many it looked at), keeping only the few it shows. The results
download reads the whole finished list the same way, a chunk at a time, so it streams with flat memory."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.models import Run
from ..store.batch_view import batch_view
from ..store.runs import RunStore

__all__ = ["BatchPage", "BatchRow", "batch_page", "recent_batches", "result_lines"]

CHUNK = 500
SCAN_LIMIT = 5000
SHOWN = 10


@dataclass(frozen=True)
class BatchRow:
    id: str
    tenant: str
    created_at: float
    size: int
    finished: int
    statuses: dict[str, int]
    tokens: int
    cost_usd: float
    submitting: bool

    @property
    def percent(self) -> int:
        return 100 if self.size == 0 and not self.submitting else (self.finished * 100 // self.size if self.size else 0)


@dataclass(frozen=True)
class BatchPage:
    row: BatchRow
    prompt_tokens: int
    completion_tokens: int
    slowest: list[Run] = field(default_factory=list)  # the longest submit-to-end times, longest first
    failed: list[Run] = field(default_factory=list)  # finished runs that did not succeed, in finishing order
    looked_at: int = 0  # finished runs read for the two lists


def _row(batch_id: str, info: dict[str, str], view: dict[str, Any]) -> BatchRow:
    usage = view["usage"]
    return BatchRow(batch_id, info.get("tenant", ""), float(info.get("created_at", 0)), view["size"],
                    view["finished"], view["statuses"],
                    int(usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)),
                    float(usage.get("cost_usd", 0.0)), "submitting" in info)


def visible(store: RunStore, batch_id: str, tenant: str | None) -> dict[str, str] | None:
    """The batch's record if the caller may see it (its tenant, or None for an operator), else None."""
    info = store.batches.info(batch_id)
    if not info or (tenant is not None and info.get("tenant") != tenant):
        return None
    return info


def recent_batches(store: RunStore, tenant: str | None, limit: int = 50,
                   before: float | None = None) -> tuple[list[BatchRow], float | None]:
    """Up to `limit` batches, newest first, and the `before` of the next page (None at the end)."""
    entries = store.batches.recent(tenant, limit, before)
    rows, gone = [], []
    for batch_id, _ in entries:
        info = visible(store, batch_id, tenant)
        view = batch_view(store, batch_id) if info is not None else None
        if info is None or view is None:
            gone.append(batch_id)
            continue
        rows.append(_row(batch_id, info, view))
    store.batches.forget(tenant, gone)
    return rows, (entries[-1][1] if len(entries) == limit else None)


def _duration(run: Run) -> float:
    return (run.finished_at or run.updated_at) - run.created_at


def batch_page(store: RunStore, batch_id: str, tenant: str | None, scan_limit: int = SCAN_LIMIT,
               shown: int = SHOWN) -> BatchPage | None:
    info = visible(store, batch_id, tenant)
    view = batch_view(store, batch_id) if info is not None else None
    if info is None or view is None:
        return None
    slowest: list[tuple[float, str, Run]] = []  # a min-heap of the `shown` longest
    failed: list[Run] = []
    looked = 0
    while looked < min(scan_limit, view["finished"]):
        ids = store.batches.finished_range(batch_id, looked, min(CHUNK, scan_limit - looked))
        if not ids:
            break
        looked += len(ids)
        for run in store.load_runs(ids):
            if run is None:
                continue
            item = (_duration(run), run.id, run)
            if len(slowest) < shown:
                heapq.heappush(slowest, item)
            elif item[0] > slowest[0][0]:
                heapq.heapreplace(slowest, item)
            if run.status.value != "succeeded" and len(failed) < shown:
                failed.append(run)
    usage = view["usage"]
    return BatchPage(_row(batch_id, info, view), int(usage.get("prompt_tokens", 0)),
                     int(usage.get("completion_tokens", 0)),
                     [r for _, _, r in sorted(slowest, key=lambda i: (-i[0], i[1]))], failed, looked)


def result_lines(store: RunStore, batch_id: str) -> Iterator[str]:
    """The batch's results, one JSON line per finished run in the order they finished: the lines
    `reactq batch --out` writes (runs whose records are gone are left out, as that command counts them lost)."""
    start = 0
    while ids := store.batches.finished_range(batch_id, start, CHUNK):
        start += len(ids)
        yield "".join(json.dumps(run.result_line(), ensure_ascii=False) + "\n"
                      for run in store.load_runs(ids) if run is not None)
