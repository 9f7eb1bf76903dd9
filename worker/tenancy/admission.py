"""Admission control per tenant, from its plan: budgets already spent, runs in flight, submissions
per minute (checked before a submission writes anything), and open event streams.

Refusals are `AdmissionRefused` carrying when to try again: the HTTP API answers 429 with
`Retry-After`, `reactq batch` waits that long and goes on.
"""

from __future__ import annotations

import time
import uuid

from ..errors import AdmissionRefused, QuotaExceeded, TooLarge
from ..store.streams import StreamSlots
from ..store.submissions import Quota
from .budgets import TenantBudgets
from .tenants import Policy

INFLIGHT_RETRY_S = 5  # no clock says when a run will finish: ask again soon
STREAM_LEASE_S = 60  # an open stream renews its slot after every read (at most 5 s apart); a dead API process's lapse


def quota(budgets: TenantBudgets, policy: Policy, count: int, now: float | None = None) -> Quota:
    """Raise AdmissionRefused (a budget spent) or TooLarge now, or give the tenant's quota for `count`
    new runs: its runs in flight and submissions per minute are checked, and counted, by the script
    that records the runs (SubmissionStore.create_runs), so that two submitters cannot both take the last slot."""
    now = now or time.time()
    tenant, limits = policy.tenant, policy.plan.limits
    over = budgets.over(tenant, policy.budgets, now)
    if over is not None:
        raise AdmissionRefused(over.message(tenant), int(over.resets_at - now) + 1)
    if count > limits.runs_in_flight:
        raise TooLarge(f"{count} runs in one submission; plan {policy.plan.name!r} allows "
                       f"{limits.runs_in_flight} runs in flight: submit them in smaller parts")
    if count > limits.submissions_per_minute:
        raise TooLarge(f"{count} runs in one submission; plan {policy.plan.name!r} allows "
                       f"{limits.submissions_per_minute} submissions per minute: submit them in smaller parts")
    return Quota(tenant, count, limits.runs_in_flight, limits.submissions_per_minute)


def refusal(exceeded: QuotaExceeded, policy: Policy, now: float | None = None) -> AdmissionRefused:
    """What to tell the submitter whose runs a quota did not admit."""
    now = now or time.time()
    tenant, limits = policy.tenant, policy.plan.limits
    if exceeded.limit == "in_flight":
        return AdmissionRefused(f"tenant {tenant!r} has {limits.runs_in_flight} runs in flight, the limit of "
                                f"plan {policy.plan.name!r}; submit more as they finish", INFLIGHT_RETRY_S)
    return AdmissionRefused(f"tenant {tenant!r} reached {limits.submissions_per_minute} submissions per minute, "
                            f"the limit of plan {policy.plan.name!r}", int(60 - now % 60) + 1)


# --- event streams -------------------------------------------------------------------------------
class StreamSlot:
    """One open event stream of a tenant, counted across every API process (worker/store/streams.py)."""

    def __init__(self, slots: StreamSlots, policy: Policy) -> None:
        self.slots = slots
        self.tenant = policy.tenant
        self.policy = policy
        self.id = uuid.uuid4().hex

    async def open(self) -> None:
        now = time.time()
        limit = self.policy.plan.limits.sse_streams
        if not await self.slots.open(self.tenant, self.id, now, now + STREAM_LEASE_S, limit):
            raise AdmissionRefused(f"tenant {self.policy.tenant!r} has {limit} event streams open, the limit of "
                                   f"plan {self.policy.plan.name!r}; close one first", 5)

    async def renew(self) -> None:
        await self.slots.renew(self.tenant, self.id, time.time() + STREAM_LEASE_S)

    async def close(self) -> None:
        await self.slots.close(self.tenant, self.id)
