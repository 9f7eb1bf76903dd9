"""A tenant's spend and usage: the spend hashes per period (`keys.tenant_spend`) with the script that
reserves a call's worst case in them, usage since the tenant began, and its runs in flight. The budget
decisions and the ledger's commands are worker/tenancy's (budgets, ledger); this runs them."""

from __future__ import annotations

from typing import Any

import redis

from ..core.models import Usage
from . import keys
from .cas import Command, run_commands
from .scripts import lua

_RESERVE = lua(__file__, "reserve_budget.lua")

Periods = tuple[str, str]  # (day, month) as in the spend keys: `d:YYYY-MM-DD`, `m:YYYY-MM`


def usage_commands(key: str, usage: Usage, cost: float) -> list[Command]:
    """The writes that add `usage` and `cost` to a usage hash (a tenant's, a batch's)."""
    return [("HINCRBY", key, "prompt_tokens", usage.prompt_tokens),
            ("HINCRBY", key, "completion_tokens", usage.completion_tokens),
            ("HINCRBYFLOAT", key, "cost_usd", repr(cost))]


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
