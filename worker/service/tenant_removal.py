"""What becomes of a removed tenant's data (`reactq tenant remove NAME [--purge]`). Its unfinished runs are
cancelled; then, by default, everything stored under its id is kept until retention expires it (the keys
without a TTL get `retention_s`), or, with --purge, removed now: its runs (every key), batches, webhook
deliveries, eval reports, spend and usage counters, indexes and tool cache. No later tenant can see any of
it either way: a tenant added with the same name has another id (docs/decisions/tenants-and-keys.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..store.runs import RunStore
from ..store.tenant_data import TenantData
from .retention import delete_batch, delete_run
from .submit import cancel


@dataclass(frozen=True)
class DataEnd:
    cancelled: int  # unfinished runs cancelled
    runs_deleted: int  # with --purge
    keys: int  # keys deleted (--purge) or given the retention TTL


def end_data(store: RunStore, data: TenantData, tenant_id: str, inflight: list[str], *, purge: bool, keep_s: int | None,
             wake: Callable[[str, int], None] | None = None) -> DataEnd:
    """Cancel the unfinished runs, then purge, or give the data `keep_s` to live (None: leave it as it is,
    for a tenant of REACTQ_TENANTS, which still exists)."""
    unfinished = [run.id for run in store.load_runs(inflight) if run is not None and not run.status.finished]
    for run_id in unfinished:
        cancel(store, run_id, wake)
    if not purge:
        return DataEnd(len(unfinished), 0, 0 if keep_s is None else data.expire_all(tenant_id, keep_s))
    deleted = 0
    ids = data.run_ids(tenant_id)
    for start in range(0, len(ids), 500):
        for found in store.load_runs(ids[start:start + 500]):
            if found is not None and found.spec.tenant == tenant_id:
                delete_run(store, found)
                deleted += 1
    for batch_id in data.batch_ids(tenant_id):
        if store.batches.info(batch_id).get("tenant") == tenant_id:
            delete_batch(store, batch_id)
    return DataEnd(len(unfinished), deleted, data.delete_all(tenant_id))
