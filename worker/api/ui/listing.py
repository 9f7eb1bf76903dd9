"""The runs page's list: one tenant's runs through the index `GET /v1/runs` pages (store/run_index.py),
or, for an operator without a tenant filter, every tenant's pages merged newest first. The cursor is the
index's own (`<created_at>_<run id>`), so it means the same in every tenant's index."""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass

from ...core.models import Run, RunStatus
from ...errors import InvalidRequest
from ...runtime.context import Runtime
from ...store import run_index

PAGE_SIZE = 25
COUNT_SCAN = 2000  # the live counts cover at most this many of the newest matching runs


@dataclass(frozen=True)
class Filters:
    status: str | None = None
    batch_id: str | None = None
    model: str | None = None
    since: float | None = None  # created at or after (epoch seconds)
    until: float | None = None  # created before
    tenant: str | None = None  # an operator's tenant filter

    def match(self, run: Run) -> bool:
        return (self.model is None or run.model == self.model) and (self.until is None or run.created_at < self.until)

    def query(self) -> dict[str, str]:
        """The filters as the runs page's query string (for links to the next page and the counts)."""
        out = {"status": self.status, "batch_id": self.batch_id, "model": self.model, "tenant": self.tenant,
               "since": _local(self.since), "until": _local(self.until)}
        return {k: v for k, v in out.items() if v}


def parse_time(text: str | None, name: str) -> float | None:
    """A `datetime-local` field (UTC) as epoch seconds; InvalidRequest when malformed."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        raise InvalidRequest(f"{name}: expected a date and time such as 2026-12-01T17:30") from None


def _local(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M")


def check_status(status: str | None) -> str | None:
    if status and status not in {s.value for s in RunStatus}:
        raise InvalidRequest(f"unknown status {status!r}")
    return status or None


def _tenants(rt: Runtime, tenant: str | None, filters: Filters) -> list[str]:
    """The tenants whose runs to list: the caller's, else (operator) the filter's (a name or an id) or every
    tenant."""
    if tenant is not None:
        return [tenant]
    return [rt.tenants.id_of(filters.tenant) or filters.tenant] if filters.tenant else rt.tenants.ids()


def _key(run: Run) -> tuple[float, str]:
    return run.created_at, run.id


def page(rt: Runtime, tenant: str | None, filters: Filters, cursor: str | None,
         limit: int = PAGE_SIZE) -> run_index.Page:
    """A page of runs, newest first. `tenant` None: an operator (every tenant, or `filters.tenant`)."""
    found: list[Run] = []
    more = False
    for name in _tenants(rt, tenant, filters):
        got = run_index.page(rt.store, name, status=filters.status, batch_id=filters.batch_id, cursor=cursor,
                             limit=limit, max_age_s=rt.settings.run_ttl_s + rt.settings.retention_s,
                             match=filters.match, oldest=filters.since)
        found += got.runs
        more = more or got.next_cursor is not None
    found.sort(key=_key, reverse=True)
    more = more or len(found) > limit
    found = found[:limit]
    if not found or not more:
        return run_index.Page(found, None)
    return run_index.Page(found, f"{found[-1].created_at!r}_{found[-1].id}")


def counts(rt: Runtime, tenant: str | None, filters: Filters) -> tuple[dict[str, int], bool]:
    """How many of the matching runs are in each status (every filter but the status), and whether the
    newest COUNT_SCAN did not cover them all."""
    unfiltered = Filters(None, filters.batch_id, filters.model, filters.since, filters.until, filters.tenant)
    listed = page(rt, tenant, unfiltered, None, COUNT_SCAN)
    tally = Counter(run.status.value for run in listed.runs)
    return {s.value: tally.get(s.value, 0) for s in RunStatus}, listed.next_cursor is not None
