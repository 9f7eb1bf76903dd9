"""The tenant ledger: what counts a tenant's spend, as Redis commands the store runs with the write they
belong to (a run's end, a stored reply, a settled reservation); the commands themselves are
worker/store/spend.py's.

Two accounts are kept per tenant:
- spend per day and per month (`keys.tenant_spend`), what budgets are checked against. A tenant with a
  budget has each call's worst case reserved there before the call is made (budgets.TenantBudgets.reserve)
  and settled to what it cost. A tenant without one is charged a run's calls when the run ends (the
  run record's `uncounted`), in the day and month it ends in; a call whose step was not recorded (fenced
  by another delivery) or whose reply was stored before acting is charged at once;
- usage since the tenant began (`keys.tenant_usage`), counted when each run ends, as its batch's is.
  Only a failed call's, which no step records, is counted at once, on the tenant and on the batch.
"""

from __future__ import annotations

import calendar
import time
from datetime import UTC, datetime

from ..core.models import Run, Usage
from ..store import keys
from ..store.cas import Command
from ..store.spend import Spend, spend_commands
from ..store.spend import usage_commands as count_usage


def next_day(now: float) -> float:
    t = datetime.fromtimestamp(now, UTC)
    return datetime(t.year, t.month, t.day, tzinfo=UTC).timestamp() + 86400


def next_month(now: float) -> float:
    t = datetime.fromtimestamp(now, UTC)
    days = calendar.monthrange(t.year, t.month)[1]
    return datetime(t.year, t.month, 1, tzinfo=UTC).timestamp() + days * 86400


def charge_now(tenant: str, due: Spend) -> list[Command]:
    """The writes that charge a call's spend `due` (Reservation.settle's) now, not at its run's end: its
    step was not recorded, or its reply is stored before acting."""
    return spend_commands(tenant, due, time.time()) if due.tokens or due.usd else []


def usage_commands(run: Run, usage: Usage, cost: float) -> list[Command]:
    """The writes that count a failed call's usage on the run's tenant and batch at once: no step records
    it, so neither the run's end (its Uncounted) nor its batch's count of its usage holds it."""
    commands = count_usage(keys.tenant_usage(run.spec.tenant), usage, cost)
    if run.spec.batch_id:
        commands += count_usage(keys.batch(run.spec.batch_id), usage, cost)
    return commands
