"""Submitting, inspecting and cancelling runs: what the CLI and the HTTP API share."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from ..config import Settings
from ..core.models import Run, RunSpec, RunStatus
from ..errors import InvalidRequest, QuotaExceeded, TierNotAllowed
from ..runtime.webhooks import validate_url
from ..store.runs import DECLINED, Declined, RunStore
from ..store.submissions import Quota
from ..tenancy.admission import quota, refusal
from ..tenancy.budgets import TenantBudgets
from ..tenancy.fairness import INTERACTIVE, WINDOW_S, batch_priorities
from ..tenancy.plans import known_tiers
from ..tenancy.tenants import Policy, Tenants

MAX_DEADLINE_S = 7 * 24 * 3600.0


def known_models(settings: Settings) -> list[str]:
    """The models a run may name: the default and those of REACTQ_MODELS (a bounded metric label)."""
    return sorted({settings.model, *settings.models})


def validate_spec(spec: RunSpec, settings: Settings, tiers: Sequence[str], where: str = "",
                  policy: Policy | None = None) -> None:
    """Check what a submission asks for; with the tenant's `policy`, also that its plan allows the tier."""
    prefix = f"{where}: " if where else ""
    question = spec.question.strip()
    if not question:
        raise InvalidRequest(f"{prefix}the question is empty")
    if len(spec.question) > settings.max_question_chars:
        raise InvalidRequest(
            f"{prefix}the question has {len(spec.question)} characters; the limit is "
            f"{settings.max_question_chars} (REACTQ_MAX_QUESTION_CHARS)"
        )
    if spec.tier not in tiers:
        raise InvalidRequest(f"{prefix}unknown tier {spec.tier!r}; known tiers: {', '.join(tiers)}")
    if policy is not None and (refused := policy.check_tier(spec.tier)):
        raise TierNotAllowed(prefix + refused)
    if spec.model is not None and spec.model not in known_models(settings):
        raise InvalidRequest(f"{prefix}unknown model {spec.model!r}; known models: "
                             f"{', '.join(known_models(settings))} (configure REACTQ_MODELS)")
    if spec.deadline_s is not None and not 1 <= spec.deadline_s <= MAX_DEADLINE_S:
        raise InvalidRequest(f"{prefix}deadline_s must be between 1 and {MAX_DEADLINE_S:.0f} (7 days), "
                             f"got {spec.deadline_s:g}")
    if spec.max_steps is not None and not 1 <= spec.max_steps <= 200:
        raise InvalidRequest(f"{prefix}max_steps must be between 1 and 200, got {spec.max_steps}")
    for name, value in (("max_tokens", spec.max_tokens), ("max_cost_usd", spec.max_cost_usd)):
        if value is not None and value <= 0:
            raise InvalidRequest(f"{prefix}{name} must be more than 0, got {value}")
    if spec.output_schema is not None:
        from ..output_schema import schema_problem  # jsonschema: imported for the runs that bring a schema

        if (bad_schema := schema_problem(spec.output_schema)) is not None:
            raise InvalidRequest(prefix + bad_schema)
    if spec.webhook_url is not None:
        try:
            validate_url(spec.webhook_url)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{prefix}{exc}") from None


def tenant_policy(tenants: Tenants, tenant: str) -> Policy:
    """The tenant's policy, or InvalidRequest naming only that tenant."""
    policy = tenants.policy(tenant)
    if policy is None:
        raise InvalidRequest(f"unknown tenant {tenant!r} (add it with `reactq tenant add`, or list it in "
                             "REACTQ_TENANTS)")
    return policy


def new_run(spec: RunSpec, settings: Settings) -> Run:
    now = time.time()
    return Run(
        spec=spec.model_copy(update={"question": spec.question.strip()}),
        max_steps=spec.max_steps or settings.max_steps,
        mode=spec.mode or settings.mode,
        model=spec.model or settings.model,
        created_at=now,
        updated_at=now,
        deadline_s=spec.deadline_s or settings.run_deadline_s,
    )


def submit(
    store: RunStore, specs: Sequence[RunSpec], settings: Settings, send_step: Callable[..., None],
    batch_id: str | None = None, *, tenants: Tenants, budgets: TenantBudgets, admit_runs: bool = True,
    interactive: bool = False, make_run: Callable[[RunSpec, Settings], Run] | None = None,
    on_recorded: Callable[[list[Run]], None] | None = None,
) -> list[Run]:
    """Validate every spec first (nothing is submitted if one is bad), check admission for each tenant
    (AdmissionRefused), then record and enqueue them. `tenants`: where policies are read: the API passes
    one that reads them afresh (a submission sees a budget lowered a moment ago); a process that submits
    chunk after chunk passes its memoising one (Runtime.tenants: a change applies within 1 s). `budgets`:
    where a tenant's spend is read (a tenant over budget is refused).

    Each run's first step goes out with its priority (worker/tenancy/fairness.py): interactive runs first, then
    each tenant's runs by how many it submitted lately; every later step of the run keeps it.

    `make_run` (default new_run) and `on_recorded` (called once the runs are admitted and recorded, before
    any step is sent) are how a replay (service/replay.py) goes through this same door with its fork."""
    tiers = known_tiers(settings)
    policies: dict[str, Policy] = {}
    errors = []
    for i, spec in enumerate(specs):
        where = f"runs[{i}]" if len(specs) > 1 else ""
        if spec.client_id:
            where = f"{where} (id {spec.client_id!r})".strip()
        try:
            if spec.tenant not in policies:
                policies[spec.tenant] = tenant_policy(tenants, spec.tenant)
            validate_spec(spec, settings, tiers, where, policies[spec.tenant])
        except TierNotAllowed:
            raise
        except InvalidRequest as exc:
            errors.append(str(exc))
    if errors:
        raise InvalidRequest("; ".join(errors))
    quotas = None
    if admit_runs:
        quotas = [quota(budgets, policy, sum(1 for s in specs if s.tenant == tenant))
                  for tenant, policy in policies.items()]
    runs = [(make_run or new_run)(spec.model_copy(update={"batch_id": batch_id, **_plan_defaults(spec, policies)}),
                                  settings) for spec in specs]
    recent = _record(store, runs, batch_id, None if interactive else WINDOW_S, quotas, policies)
    if on_recorded is not None:
        on_recorded(runs)
    by_tenant: dict[str, list[Run]] = {}
    for run in runs:
        by_tenant.setdefault(run.spec.tenant, []).append(run)
    for tenant, group in by_tenant.items():
        priorities = [INTERACTIVE] * len(group) if interactive else batch_priorities(recent[tenant], len(group))
        for run, priority in zip(group, priorities, strict=True):
            send_step(run.id, run.current_step, priority=priority)
    return runs


def _plan_defaults(spec: RunSpec, policies: dict[str, Policy]) -> dict[str, object]:
    """What the run's plan decides where the submission did not: fixed at submission, so a plan changed
    later does not change a run under way."""
    if spec.python_session is None:
        return {"python_session": policies[spec.tenant].plan.python_session}
    return {}


def _record(store: RunStore, runs: list[Run], batch_id: str | None, count_window_s: int | None,
            quotas: list[Quota] | None, policies: dict[str, Policy]) -> dict[str, int]:
    """Record the runs if their tenants' quotas admit them (AdmissionRefused if not). Runs whose record
    expired without finishing still hold in-flight slots: on a refusal for runs in flight those are
    dropped and the runs tried once more."""
    try:
        return store.submissions.create_runs(runs, batch_id, count_window_s, quotas)
    except QuotaExceeded as exc:
        if exc.limit != "in_flight":
            raise refusal(exc, policies[exc.quota.tenant]) from None
        store.submissions.forget_expired_in_flight(exc.quota.tenant)
    try:
        return store.submissions.create_runs(runs, batch_id, count_window_s, quotas)
    except QuotaExceeded as exc:
        raise refusal(exc, policies[exc.quota.tenant]) from None


def new_batch_id() -> str:
    return "b-" + uuid.uuid4().hex[:16]


def cancel(store: RunStore, run_id: str, wake: Callable[[str, int], None] | None = None) -> Run | None:
    """Cancel an unfinished run; it stops at its next step. Returns the run as it is now.

    A run awaiting approval has no next step coming: `wake` (send_step) delivers one, so a worker
    counts the cancellation and sends the run's webhook as for any other finished run."""
    def mutate(run: Run) -> RunStatus | Declined:
        """The status the run had, once cancelled."""
        if run.status.finished:
            return DECLINED
        was = run.status
        run.status = RunStatus.CANCELLED
        run.error = "cancelled by request"
        run.finished_at = time.time()
        return was

    cancelled = store.update_run(run_id, mutate)
    if cancelled.run is not None and cancelled.value == RunStatus.AWAITING_APPROVAL and wake is not None:
        wake(cancelled.run.id, cancelled.run.current_step)
    return cancelled.run or store.load_run(run_id)
