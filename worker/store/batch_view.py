"""A batch's figures as its webhook and `GET /v1/batches/{id}` show them."""

from __future__ import annotations

from typing import Any

from . import keys
from .runs import RunStore


def batch_view(store: RunStore, batch_id: str) -> dict[str, Any] | None:
    """A batch's figures, or None if unknown: what its webhook sends, and what `GET /v1/batches/{id}`
    returns with a page of its run ids. A few reads whatever the batch's size: `statuses` (finished runs
    by status) comes from counters kept as runs end. A batch created before those counters existed has
    its runs read, in chunks, instead (their statuses, finished or not, as this view used to show)."""
    finished = store.batches.finished_count(batch_id)  # read first: every run it counts is in what follows
    info = store.batches.info(batch_id)
    if not info:
        return None
    size = store.batches.size(batch_id)
    if keys.BATCH_COUNTS_STATUSES in info:
        counts = {k.removeprefix(keys.BATCH_STATUS_FIELD): int(v) for k, v in info.items()
                  if k.startswith(keys.BATCH_STATUS_FIELD) and int(v) > 0}
    else:
        counts = {}
        for chunk in store.batches.iter_run_ids(batch_id):
            for run in store.load_runs(chunk):
                if run is not None:
                    counts[run.status.value] = counts.get(run.status.value, 0) + 1
    return {
        "batch_id": batch_id,
        "size": size,
        "finished": finished,
        "unfinished": max(0, size - finished),
        "statuses": dict(sorted(counts.items())),
        "usage": {k: float(v) for k, v in info.items() if k in ("prompt_tokens", "completion_tokens", "cost_usd")},
        "runs_url": f"/v1/runs?batch_id={batch_id}",
    }
