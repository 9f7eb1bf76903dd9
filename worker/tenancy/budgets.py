"""Budgets, checked before each LLM call with a reservation, so no call can overshoot.

Before a call: the run's own budget (`max_tokens`, `max_cost_usd` of the run, and the global
`REACTQ_MAX_TOKENS_PER_RUN`) decides the call's `max_tokens` (the prompt's size is estimated
conservatively); then the tenant's daily and monthly budgets get the call's worst case (prompt
estimate + `max_tokens`) reserved, atomically, by one Lua script. After the call the reservation is
settled to what the provider billed. A call whose worst case does not fit is never made: the run ends
`budget_exceeded` with the figures in its error.

A worker killed between reserving and settling leaves its reservation counted: the tenant is charged
a worst case it did not spend, never the other way round.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..config import ModelSpec, Settings
from ..core.models import Run, Usage
from ..core.pricing import cost_usd
from ..errors import BudgetExceeded
from ..llm.fallback import model_chain
from ..store.spend import DAY_TTL_S, MONTH_TTL_S, Spend, SpendStore, periods, spend_commands
from .ledger import next_day, next_month
from .plans import Budgets
from .tenants import Policy, Tenants

NOTHING_DUE = Spend(0, 0.0)
MIN_COMPLETION_TOKENS = 16  # a call that could not even write this much is not worth making
MIN_CALL_TOKENS = 256  # no prompt is smaller: a tenant with fewer tokens left cannot make a call
_CHARS_PER_TOKEN = 2.5  # ASCII: JSON and code tokenise densely, so over- rather than under-reserve


def estimate_text_tokens(text: str) -> int:
    """An upper estimate of a text's tokens: ASCII characters / 2.5, plus one token per UTF-8 byte of
    every other character (a byte-level BPE emits at most one token per byte: CJK is 3 bytes a
    character, an emoji 4, so characters / 2.5 would undercount them up to 10x)."""
    ascii_chars = len(text.encode("ascii", "ignore"))
    other_bytes = len(text.encode("utf-8", "surrogatepass")) - ascii_chars
    return int(ascii_chars / _CHARS_PER_TOKEN) + other_bytes


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the run's own budget (pure) -----------------------------------------------------------------
def estimate_prompt_tokens(messages: list[dict[str, Any]], options: dict[str, Any]) -> int:
    text = json.dumps(messages, ensure_ascii=False) + json.dumps(options.get("tools") or [], ensure_ascii=False)
    return estimate_text_tokens(text) + 8 * len(messages) + 16


def call_max_tokens(run: Run, prompt_estimate: int, default_max: int, global_max_tokens: int,
                    prices: dict[str, tuple[float, float]]) -> int:
    """The `max_tokens` of the run's next call, or BudgetExceeded if the run's budget has no room."""
    allowed = default_max
    spent = run.usage.total
    for limit, what in ((run.spec.max_tokens, "max_tokens"), (global_max_tokens, "REACTQ_MAX_TOKENS_PER_RUN")):
        if not limit:
            continue
        room = limit - spent - prompt_estimate
        if room < MIN_COMPLETION_TOKENS:
            raise BudgetExceeded(
                f"run token budget ({what}={limit}): {spent} tokens used; the next call needs up to "
                f"{prompt_estimate + MIN_COMPLETION_TOKENS} (prompt ~{prompt_estimate})")
        allowed = min(allowed, room)
    if run.spec.max_cost_usd:
        price_in, price_out = prices.get(run.model, (0.0, 0.0))
        prompt_cost = prompt_estimate * price_in / 1e6
        room_usd = run.spec.max_cost_usd - run.cost_usd - prompt_cost
        if price_out > 0:
            room = int(room_usd * 1e6 / price_out)
            if room < MIN_COMPLETION_TOKENS:
                raise BudgetExceeded(
                    f"run cost budget (max_cost_usd={run.spec.max_cost_usd}): ${run.cost_usd:.6f} spent; the "
                    f"next call may cost up to ${prompt_cost + MIN_COMPLETION_TOKENS * price_out / 1e6:.6f}")
            allowed = min(allowed, room)
        elif room_usd < 0:
            raise BudgetExceeded(f"run cost budget (max_cost_usd={run.spec.max_cost_usd}): "
                                 f"${run.cost_usd:.6f} spent")
    return allowed


# --- the tenant's budgets (their spend is worker/store/spend.py's) --------------------------------
@dataclass(frozen=True)
class Over:
    """A tenant budget that is spent: which, and when it resets."""

    budget: str
    used: float
    limit: float
    resets_at: float

    def message(self, tenant: str) -> str:
        return (f"tenant {tenant!r} has spent its {self.budget.replace('_', ' ')} budget "
                f"({_fmt(self.used)} of {_fmt(self.limit)}); it resets at {_iso(self.resets_at)}")


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}"


def _resets_at(budget: str, now: float) -> float:
    return next_day(now) if budget.endswith("day") else next_month(now)


def _limited(budgets: Budgets) -> bool:
    """Whether the tenant has any budget at all (0 is no limit)."""
    return any((budgets.tokens_per_day, budgets.usd_per_day, budgets.tokens_per_month, budgets.usd_per_month))


class TenantBudgets:
    def __init__(self, spend: SpendStore) -> None:
        self.store = spend

    def spend(self, tenant: str, now: float | None = None) -> tuple[Spend, Spend]:
        """(today's, this month's) spend, reservations in flight included."""
        day, month = self.store.spend(tenant, periods(now or time.time()))
        return Spend(*day), Spend(*month)

    def over(self, tenant: str, budgets: Budgets, now: float | None = None) -> Over | None:
        """The first spent budget (429 on submit), or None. A token budget with less left than the
        smallest useful call (`MIN_CALL_TOKENS`) counts as spent: a run submitted then could not
        make its first call."""
        if not _limited(budgets):
            return None  # no budget to be over: no need to read the spend
        now = now or time.time()
        day, month = self.spend(tenant, now)
        for budget, used, limit in (("tokens_per_day", day.tokens, budgets.tokens_per_day),
                                    ("usd_per_day", day.usd, budgets.usd_per_day),
                                    ("tokens_per_month", month.tokens, budgets.tokens_per_month),
                                    ("usd_per_month", month.usd, budgets.usd_per_month)):
            if limit and used + (MIN_CALL_TOKENS if budget.startswith("tokens") else 0) >= limit:
                return Over(budget, used, limit, _resets_at(budget, now))
        return None

    def reserve(self, tenant: str, budgets: Budgets, tokens: int, usd: float, now: float) -> Spend:
        """Reserve a call's worst case (BudgetExceeded if a budget has no room); returns what was
        reserved: nothing for a tenant without budgets (its spend is still counted when settled)."""
        if not _limited(budgets):
            return Spend(0, 0.0)
        refused = self.store.reserve(tenant, periods(now), (DAY_TTL_S, MONTH_TTL_S), tokens, usd,
                                     (budgets.tokens_per_day, budgets.usd_per_day, budgets.tokens_per_month,
                                      budgets.usd_per_month))
        if refused is not None:
            name, used, limit = refused
            over = Over(name, used, limit, _resets_at(name, now))
            needed = f"${usd:.6f}" if name.startswith("usd") else f"{tokens} tokens"
            raise BudgetExceeded(f"{over.message(tenant)}; the next call needs up to {needed}",
                                 int(over.resets_at - now) + 1)
        return Spend(tokens, usd)

    def settle(self, tenant: str, reserved: Spend, actual: Spend, reserved_at: float) -> None:
        """Replace a reservation by what the call cost, in the periods it was reserved in (a call
        straddling midnight is charged to the day it started)."""
        self.store.run(spend_commands(tenant, Spend(actual.tokens - reserved.tokens, actual.usd - reserved.usd),
                                      reserved_at))


class Reservation:
    """One LLM call's budget: send `max_tokens`, then `settle` it to what the call used."""

    def __init__(self, budgets: TenantBudgets, tenant: str, max_tokens: int, reserved: Spend, at: float) -> None:
        self.budgets, self.tenant, self.max_tokens, self.reserved, self.at = budgets, tenant, max_tokens, reserved, at
        self.settled = False

    def settle(self, usage: Usage, cost: float) -> Spend:
        """Charge what the call cost; what is still to be charged comes back. A reservation is replaced by
        the cost now (nothing comes back); a tenant without budgets reserved nothing, and gets the whole
        cost back, for the run's end to charge (ledger.py) instead of a write of its own."""
        self.settled = True
        actual = Spend(usage.total, cost)
        if self.reserved.tokens or self.reserved.usd:
            self.budgets.settle(self.tenant, self.reserved, actual, self.at)
            return NOTHING_DUE
        return actual


def worst_prices(model: str, models: dict[str, ModelSpec], prices: dict[str, tuple[float, float]]
                 ) -> dict[str, tuple[float, float]]:
    """`model` priced at the dearest of it and its fallbacks (worker/llm/fallback.py): any of them may
    answer the call, so a reservation assumes the dearest."""
    priced = [prices[m] for m in model_chain(models, model) if m in prices]
    if not priced:
        return {}
    return {model: (max(p[0] for p in priced), max(p[1] for p in priced))}


@contextmanager
def reserve_call(s: Settings, tenants: Tenants, budgets: TenantBudgets, run: Run, messages: list[dict[str, Any]],
                 options: dict[str, Any]) -> Iterator[Reservation]:
    """Reserve the worst case of one LLM call of `run` against its own and its tenant's budgets
    (BudgetExceeded if either has no room); what was not settled by the caller is settled on exit (a
    failed call spent nothing)."""
    prices = worst_prices(run.model, s.models, s.prices_per_mtok)
    prompt = estimate_prompt_tokens(messages, options)
    max_tokens = call_max_tokens(run, prompt, s.llm_max_tokens, s.max_tokens_per_run, prices)
    worst = Usage(prompt_tokens=prompt, completion_tokens=max_tokens)
    worst_cost = cost_usd(run.model, worst, prices)
    policy = tenants.policy(run.spec.tenant)
    if policy is None:
        raise BudgetExceeded(f"tenant {run.spec.tenant!r} no longer exists; no budget to spend")
    now = time.time()
    reserved = budgets.reserve(run.spec.tenant, policy.budgets, prompt + max_tokens, worst_cost, now)
    call = Reservation(budgets, run.spec.tenant, max_tokens, reserved, now)
    try:
        yield call
    finally:
        if not call.settled:  # the call failed: nothing was spent, and a reservation is given back
            call.settle(Usage(), 0.0)


def usage_report(budgets: TenantBudgets, policy: Policy, now: float | None = None) -> dict[str, Any]:
    """A tenant's spend against its budgets (`reactq tenant usage`, `GET /v1/usage`)."""
    now = now or time.time()
    b = policy.budgets
    day, month = budgets.spend(policy.tenant, now)
    total = budgets.store.usage(policy.tenant)

    def period(spend: Spend, tokens: int, usd: float, resets: float) -> dict[str, Any]:
        return {"tokens": spend.tokens, "usd": round(spend.usd, 6), "tokens_budget": tokens or None,
                "usd_budget": usd or None, "resets_at": _iso(resets)}

    limits = policy.plan.limits
    return {
        "tenant": policy.name,
        "plan": policy.plan.name,
        "day": period(day, b.tokens_per_day, b.usd_per_day, next_day(now)),
        "month": period(month, b.tokens_per_month, b.usd_per_month, next_month(now)),
        "total": {"prompt_tokens": int(total.get("prompt_tokens", 0)),
                  "completion_tokens": int(total.get("completion_tokens", 0)),
                  "cost_usd": round(total.get("cost_usd", 0.0), 6)},
        "runs_in_flight": budgets.store.in_flight(policy.tenant),
        "limits": limits.model_dump(),
    }
