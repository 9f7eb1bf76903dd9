"""The tenant ledger: every write that counts what a tenant spent is built here, as Redis commands the
store runs with the write they belong to (a step's commit, a stored reply, a settled reservation).

Two accounts are kept per tenant:
- spend per day and per month (`keys.tenant_spend`), what budgets are checked against: a call's worst
  case is reserved there before it is made (budgets.TenantBudgets.reserve) and settled to what it cost;
- usage since the tenant began (`keys.tenant_usage`), counted with each recorded step. A run's batch
  counts the same figures once, when the run ends (RunStore: the run record carries its usage); only a
  failed call's, which no step records, is counted on the batch at once.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime

from ..core.models import Run, Usage
from ..store import keys
from ..store.cas import Command
from ..store.spend import usage_commands as count_usage

DAY_TTL_S = 3 * 86400
MONTH_TTL_S = 63 * 86400


@dataclass(frozen=True)
class Spend:
    tokens: int
    usd: float


def periods(now: float) -> tuple[str, str]:
    """The day and month `now` is charged to (UTC), as they appear in the spend keys."""
    t = datetime.fromtimestamp(now, UTC)
    return f"d:{t:%Y-%m-%d}", f"m:{t:%Y-%m}"


def next_day(now: float) -> float:
    t = datetime.fromtimestamp(now, UTC)
    return datetime(t.year, t.month, t.day, tzinfo=UTC).timestamp() + 86400


def next_month(now: float) -> float:
    t = datetime.fromtimestamp(now, UTC)
    days = calendar.monthrange(t.year, t.month)[1]
    return datetime(t.year, t.month, 1, tzinfo=UTC).timestamp() + days * 86400


def spend_commands(tenant: str, spend: Spend, at: float) -> list[Command]:
    """The writes that add `spend` to the tenant's day and month of `at`."""
    commands: list[Command] = []
    for period, ttl in zip(periods(at), (DAY_TTL_S, MONTH_TTL_S), strict=True):
        key = keys.tenant_spend(tenant, period)
        commands += [("HINCRBY", key, "tokens", spend.tokens), ("HINCRBYFLOAT", key, "usd", repr(spend.usd)),
                     ("EXPIRE", key, ttl)]
    return commands


def usage_commands(run: Run, usage: Usage, cost: float, *, batch: bool = False) -> list[Command]:
    """The writes that count usage on the run's tenant (a recorded step's) and, with `batch`, on its batch
    too (a failed call's: the run's usage, counted on its batch when it ends, does not hold it)."""
    commands = count_usage(keys.tenant_usage(run.spec.tenant), usage, cost)
    if batch and run.spec.batch_id:
        commands += count_usage(keys.batch(run.spec.batch_id), usage, cost)
    return commands
