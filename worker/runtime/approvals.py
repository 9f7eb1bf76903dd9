"""Human approval of sensitive tool calls.

A call to a tool registered with `requires_approval=True`, named in `REACTQ_APPROVAL_TOOLS`, or in the
tenant's plan's `approval_required`, does not run until a person decides it. The step that meets it
records the pending call in the run record, sets the run `awaiting_approval` and returns: no worker
slot is held while it waits. `decide` (from `reactq
approve|reject` or `POST /v1/runs/{id}/approvals`) records the decision, who made it and when, and once no
call of the step is pending re-enqueues the step, which re-derives everything from what is stored (the
LLM reply, tool results) and now finds the decisions: an approved call runs, a rejected one becomes an
observation telling the model it was refused and why. An unanswered call expires after
`approval_timeout_s`; the reaper then ends the run (`timeout`) with that reason. Time spent waiting does
not use up the run's deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Literal

from .. import metrics
from ..core.engine import PlannedCall
from ..core.models import Approval, ApprovalDecision, Observation, Run, RunStatus
from ..errors import ApprovalConflict
from ..store.cas import Command
from ..store.events import event_command
from ..store.runs import DECLINED, Declined, RunStore, start_deadline
from .context import Runtime

__all__ = ["Waiting", "expire_or_defer", "gate", "needs_approval", "record_decision", "request"]


class Waiting(StrEnum):
    """Why a step could not finish its tool calls yet."""

    SANDBOX = "sandbox"
    APPROVAL = "approval"


def needs_approval(rt: Runtime, tenant: str, tool: str) -> bool:
    """Registered with requires_approval=True, named in REACTQ_APPROVAL_TOOLS, or in the tenant's plan's
    `approval_required`."""
    registered = rt.tools.get(tool)
    if (registered is not None and registered.requires_approval) or tool in rt.settings.approval_tools:
        return True
    policy = rt.tenants.policy(tenant)
    return policy is not None and tool in policy.plan.approval_required


def _find(run: Run, step: int, call_id: str) -> Approval | None:
    return next((a for a in run.approvals if a.step == step and a.call_id == call_id), None)


def gate(rt: Runtime, run: Run, index: int, planned: PlannedCall) -> Observation | Literal[Waiting.APPROVAL] | None:
    """None: the call may run. An observation: it was refused. Waiting.APPROVAL: nobody has decided yet."""
    if not needs_approval(rt, run.spec.tenant, planned.tool):
        return None
    approval = _find(run, index, planned.call.id)
    if approval is None or approval.decision is None:
        return Waiting.APPROVAL
    if rt.store.claims.claim_approval_count(run.id, index, planned.call.id, rt.settings.retention_s):
        metrics.APPROVALS.labels(approval.decision.value).inc()
    if approval.decision == ApprovalDecision.APPROVED:
        return None
    return Observation(
        call_id=planned.call.id, tool=planned.tool, outcome="refused",
        content=f"Error: a reviewer refused this call to {planned.tool}: {approval.reason or 'no reason given'}. "
                "Do not call it again; answer without it.",
    )


def _event(run_id: str, kind: str, approvals: list[Approval]) -> list[Command]:
    return [event_command(run_id, kind, json.dumps([a.model_dump(mode="json") for a in approvals]))]


def request(rt: Runtime, run: Run, index: int, calls: list[PlannedCall]) -> Run | None:
    """Record the calls as pending (once each) and put the run in `awaiting_approval`."""
    now = time.time()

    def mutate(r: Run) -> list[Approval] | Declined:
        """The approvals added (none for a call already pending)."""
        if r.status.finished or r.current_step != index:
            return DECLINED
        added = [Approval(step=index, call_id=c.call.id, tool=c.tool, arguments=c.arguments, requested_at=now,
                          expires_at=now + rt.settings.approval_timeout_s)
                 for c in calls if _find(r, index, c.call.id) is None]
        start_deadline(r, now)  # a first step waiting for a person: its deadline counts from now
        r.approvals = r.approvals + added
        r.status = RunStatus.AWAITING_APPROVAL
        r.waiting_on = "approval"
        return added

    return rt.store.update_run(run.id, mutate,
                               lambda r, added: _event(r.id, "approval_requested", added) if added else []).run


def record_decision(store: RunStore, run_id: str, call_id: str | None, approve: bool, by: str, reason: str | None,
           send_step: Callable[[str, int], None]) -> Run:
    """Decide the run's pending call `call_id` (every pending call when None). Raises ApprovalConflict when
    there is nothing to decide. Re-enqueues the step once none of its calls is pending."""
    now = time.time()

    def mutate(r: Run) -> list[Approval] | Declined:
        """The approvals decided."""
        if r.status != RunStatus.AWAITING_APPROVAL:
            return Declined(f"run {run_id} is {r.status.value}, not awaiting approval")
        pending = [a for a in r.approvals if a.step == r.current_step and a.decision is None]
        chosen = [a for a in pending if call_id is None or a.call_id == call_id]
        if not chosen:
            ids = ", ".join(a.call_id for a in pending) or "none"
            return Declined(f"run {run_id} has no pending call {call_id!r}; pending: {ids}")
        for a in chosen:
            a.decision = ApprovalDecision.APPROVED if approve else ApprovalDecision.REJECTED
            a.decided_by, a.decided_at, a.reason = by, now, reason
        if len(chosen) == len(pending):
            waited = now - min(a.requested_at for a in chosen)
            if r.deadline_at is not None:
                r.deadline_at += waited  # a person's thinking time is not the run's
            r.status = RunStatus.RUNNING
            r.waiting_on = None
        return chosen

    updated = store.update_run(run_id, mutate, lambda r, decided: _event(r.id, "approval_decided", decided))
    run = updated.run
    if run is None:
        raise ApprovalConflict(updated.value.reason if isinstance(updated.value, Declined) else f"no run {run_id!r}")
    if run.status == RunStatus.RUNNING:
        send_step(run.id, run.current_step)
    return run


def expire_or_defer(rt: Runtime, run: Run, now: float) -> Run | None:
    """For the reaper: end a run whose pending approval has expired (returns it), or make the reaper look
    again when the earliest one expires."""
    pending = [a for a in run.approvals if a.step == run.current_step and a.decision is None]
    if not pending:
        return None
    due = min(a.expires_at for a in pending)
    if due > now:
        rt.cluster.look_again_at(run.id, due - rt.settings.stale_after_s)
        return None

    def mutate(r: Run) -> list[Approval] | Declined:
        """The approvals that expired."""
        if r.status != RunStatus.AWAITING_APPROVAL:
            return DECLINED
        expired = [a for a in r.approvals if a.step == r.current_step and a.decision is None and a.expires_at <= now]
        if not expired:
            return DECLINED
        for a in expired:
            a.decision, a.decided_by, a.decided_at = ApprovalDecision.EXPIRED, "reactq", now
        names = ", ".join(f"{a.tool} ({a.call_id})" for a in expired)
        r.status = RunStatus.TIMEOUT
        r.error = f"approval of {names} not given within {rt.settings.approval_timeout_s:g} s"
        r.finished_at = now
        r.waiting_on = None
        return expired

    updated = rt.store.update_run(run.id, mutate, lambda r, expired: _event(r.id, "approval_decided", expired))
    if updated.run is not None and isinstance(updated.value, list):
        metrics.APPROVALS.labels("expired").inc(len(updated.value))
    return updated.run
