"""Replay and fork: a new run that reuses another run's recorded steps before step N and continues from
there, possibly with another model or mode (`reactq replay`, `POST /v1/runs/{id}/replay`). Steps are
numbered from 1, as `reactq trace` shows them.

A fork is a submission: it goes through `submit()`, so the tenant's plan as it is now (tiers, and the
tools its steps are offered), its budgets, its admission limits (runs in flight, submissions per
minute) and fairness apply exactly as to a new run. The source run's tier is kept only if the plan
still allows it; otherwise the fork is refused (TierNotAllowed) and the caller may name another tier."""

from __future__ import annotations

from collections.abc import Callable

from ..config import Settings
from ..core.models import Mode, Run, RunSpec, Usage
from ..errors import InvalidRequest, StepOutOfRange, TierNotAllowed
from ..store.runs import RunStore
from ..tenancy.budgets import TenantBudgets
from ..tenancy.tenants import Tenants
from .submit import new_run, submit

__all__ = ["replay"]


def replay(store: RunStore, settings: Settings, source_id: str, from_step: int, send_step: Callable[..., None],
           *, tenants: Tenants, budgets: TenantBudgets, model: str | None = None, mode: Mode | None = None,
           tier: str | None = None) -> Run:
    """Create and start the fork. Raises InvalidRequest for an unknown run, StepOutOfRange for a step it never recorded,
    TierNotAllowed when the tenant's plan no longer allows the tier, AdmissionRefused as submit() does."""
    source = store.load_run(source_id)
    if source is None:
        raise InvalidRequest(f"no run {source_id!r}")
    steps = store.load_steps(source_id)
    if not 1 <= from_step <= len(steps) + 1:
        raise StepOutOfRange(f"--from-step must be between 1 and {len(steps) + 1} (run {source_id} recorded "
                             f"{len(steps)} step(s)), got {from_step}")
    kept = steps[: from_step - 1]
    s = source.spec
    spec = RunSpec(question=s.question, tenant=s.tenant, tier=tier or s.tier, max_steps=source.max_steps,
                   mode=mode or source.mode, model=model or source.model, max_tokens=s.max_tokens,
                   max_cost_usd=s.max_cost_usd)

    def make_run(spec: RunSpec, settings: Settings) -> Run:
        run = new_run(spec, settings)
        run.current_step = len(kept)
        run.usage = sum((s.usage for s in kept), Usage())
        run.cost_usd = sum(s.cost_usd for s in kept)
        run.approvals = [a for a in source.approvals if a.step < len(kept)]
        run.forked_from = source.id
        if run.current_step >= run.max_steps:
            run.max_steps = run.current_step + 1  # room for at least the step being replayed
        return run

    try:
        [run] = submit(store, [spec], settings, send_step, tenants=tenants, budgets=budgets, interactive=True,
                       make_run=make_run, on_recorded=lambda runs: store.copy_steps(runs[0].id, kept))
    except TierNotAllowed as exc:
        if tier is not None:
            raise
        raise TierNotAllowed(f"{exc} (the tier of run {source_id}; replay it on an allowed tier with "
                             "`--tier` / \"tier\")") from None
    return run
