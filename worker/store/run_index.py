"""A tenant's runs, newest first, a page at a time (`GET /v1/runs`): the per-tenant sorted set of
run ids scored by creation time, filtered by status and batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core.models import Run
from ..errors import InvalidRequest
from . import keys
from .runs import RunStore

_SCAN = 200


@dataclass(frozen=True)
class Page:
    runs: list[Run]
    next_cursor: str | None


def _parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    if not cursor:
        return None
    score, _, run_id = cursor.partition("_")
    try:
        return float(score), run_id
    except ValueError:
        raise InvalidRequest(f"invalid cursor {cursor!r}: pass the next_cursor of the previous page") from None


def page(store: RunStore, tenant: str, *, status: str | None = None, batch_id: str | None = None,
         cursor: str | None = None, limit: int = 50, max_age_s: float | None = None,
         match: Callable[[Run], bool] | None = None, oldest: float | None = None) -> Page:
    """Up to `limit` of the tenant's runs older than `cursor`, newest first (created at `oldest` or later;
    passing `match`, when given). Ids whose record has expired are dropped from the index as they are met."""
    key = keys.tenant_runs(tenant)
    if max_age_s:
        store.r.zremrangebyscore(key, "-inf", time.time() - max_age_s)
    after = _parse_cursor(cursor)
    top: str | float = "+inf" if after is None else after[0]
    found: list[Run] = []
    last: tuple[float, str] | None = None
    skip_ties = after
    while len(found) < limit:
        entries = store.r.zrevrangebyscore(key, top, "-inf" if oldest is None else oldest, start=0, num=_SCAN,
                                           withscores=True)
        entries = [(m.decode(), s) for m, s in entries]
        if skip_ties is not None:  # members with the cursor's score: Redis orders them by id, descending
            entries = [(m, s) for m, s in entries if s < skip_ties[0] or m < skip_ties[1]]
        if not entries:
            return Page(found, None)
        runs = store.load_runs([m for m, _ in entries])
        gone = []
        for (run_id, score), run in zip(entries, runs, strict=True):
            last = (score, run_id)
            if run is None:
                gone.append(run_id)
                continue
            if (status is None or run.status.value == status) and (batch_id is None or run.spec.batch_id == batch_id) \
                    and (match is None or match(run)):
                found.append(run)
                if len(found) == limit:
                    break
        if gone:
            store.r.zrem(key, *gone)
        assert last is not None
        top, skip_ties = last[0], last
    assert last is not None
    return Page(found, f"{last[0]!r}_{last[1]}")
