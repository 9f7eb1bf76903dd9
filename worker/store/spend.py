"""A tenant's spend and usage: the spend hashes per period (`keys.tenant_spend`) with the script that
reserves a call's worst case in them, usage since the tenant began, and its runs in flight; and the
commands that count on them. The budget decisions are worker/tenancy's (budgets, ledger)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from ..core.models import Uncounted, Usage
from . import keys
from .cas import Command, run_commands
from .scripts import lua

_RESERVE = lua(__file__, "reserve_budget.lua")

Periods = tuple[str, str]  # (day, month) as in the spend keys: `d:YYYY-MM-DD`, `m:YYYY-MM`
DAY_TTL_S = 3 * 86400
MONTH_TTL_S = 63 * 86400


@dataclass(frozen=True)
class Spend:
    tokens: int
    usd: float


def periods(now: float) -> Periods:
    """The day and month `now` is charged to (UTC), as they appear in the spend keys."""
    t = datetime.fromtimestamp(now, UTC)
    return f"d:{t:%Y-%m-%d}", f"m:{t:%Y-%m}"


def spend_commands(tenant: str, spend: Spend, at: float) -> list[Command]:
    """The writes that add `spend` to the tenant's day and month of `at`."""
    commands: list[Command] = []
    for period, ttl in zip(periods(at), (DAY_TTL_S, MONTH_TTL_S), strict=True):
        key = keys.tenant_spend(tenant, period)
        commands += [("HINCRBY", key, "tokens", spend.tokens), ("HINCRBYFLOAT", key, "usd", repr(spend.usd)),
                     ("EXPIRE", key, ttl)]
    return commands


def usage_commands(key: str, usage: Usage, cost: float) -> list[Command]:
    """The writes that add `usage` and `cost` to a usage hash (a tenant's, a batch's)."""
    return [("HINCRBY", key, "prompt_tokens", usage.prompt_tokens),
            ("HINCRBY", key, "completion_tokens", usage.completion_tokens),
            ("HINCRBYFLOAT", key, "cost_usd", repr(cost))]


def uncounted_commands(tenant: str, uncounted: Uncounted, at: float) -> list[Command]:
    """The writes that count what a run's recorded steps used on its tenant, when the run ends at `at`
    (Uncounted says why then): its usage, and the spend no budget's reservation charged already."""
    commands = usage_commands(keys.tenant_usage(tenant), uncounted.usage, uncounted.cost_usd)
    if uncounted.spend_tokens or uncounted.spend_usd:
        commands += spend_commands(tenant, Spend(uncounted.spend_tokens, uncounted.spend_usd), at)
    return commands


class SpendStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._reserve = client.register_script(_RESERVE)

    def spend(self, tenant: str, periods: Periods) -> list[tuple[int, float]]:
        """(tokens, usd) spent and reserved in each period."""
        pipe = self.r.pipeline(transaction=False)
        for period in periods:
            pipe.hgetall(keys.tenant_spend(tenant, period))
        return [(int(float(raw.get(b"tokens", 0))), float(raw.get(b"usd", 0))) for raw in pipe.execute()]

    def reserve(self, tenant: str, periods: Periods, ttls_s: tuple[int, int], tokens: int, usd: float,
                limits: tuple[int, float, int, float]) -> tuple[str, float, float] | None:
        """Add `tokens` and `usd` to both periods, in one script, if each of `limits` (tokens and usd per
        day, then per month; 0 is none) has room; None if it had, else the first limit without room as
        (its budget name, used, limit), and nothing added."""
        tokens_day, usd_day, tokens_month, usd_month = limits
        result: Any = self._reserve(
            keys=[keys.tenant_spend(tenant, period) for period in periods],
            args=[tokens, repr(usd), tokens_day, repr(usd_day), tokens_month, repr(usd_month), *ttls_s],
        )
        if result[0] == b"ok":
            return None
        return result[0].decode(), float(result[1]), float(result[2])

    def run(self, commands: list[Command]) -> None:
        """Run the ledger's writes (a settled reservation) in one round trip."""
        run_commands(self.r, commands)

    def usage(self, tenant: str) -> dict[str, float]:
        """Usage since the tenant began: prompt_tokens, completion_tokens, cost_usd (absent: none yet)."""
        return {k.decode(): float(v) for k, v in self.r.hgetall(keys.tenant_usage(tenant)).items()}

    def in_flight(self, tenant: str) -> int:
        """How many of the tenant's runs are unfinished (the usage report's count)."""
        return int(self.r.scard(keys.tenant_inflight(tenant)))
