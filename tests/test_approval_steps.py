"""Approval through the in-process harness: a plan can name the tools that wait for a person, and a run
cancelled while it waits is still counted and finished by a worker (no sleeps, no subprocesses)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.fixtures_api import SHIPPED_PLANS
from tests.harness import Harness, call, final
from worker import metrics
from worker.core.models import RunStatus
from worker.core.outcome import Outcome
from worker.runtime import approvals
from worker.service.submit import cancel

CAREFUL_PLAN = """
[plans.careful]
tiers = ["free", "standard"]
tools = ["calculator", "search"]
approval_required = ["calculator"]

[plans.careful.limits]
runs_in_flight = 10
submissions_per_minute = 60
sse_streams = 2
"""


def careful_harness(make_harness: Callable[..., Harness], tmp_path: Path) -> Harness:
    plans = tmp_path / "plans.toml"
    plans.write_text(SHIPPED_PLANS + CAREFUL_PLAN)
    h = make_harness(plans_file=str(plans))
    h.rt.tenants.add("careful-co", "careful")
    return h


def test_a_tool_the_plan_names_waits_for_approval(make_harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = careful_harness(make_harness, tmp_path)
    h.llm.script(call("calculator", {"expression": "6 * 7"}), final("42"))
    run_id = h.submit("What is 6 * 7?", tenant=h.rt.tenants.resolve("careful-co"), tier="standard")
    assert h.drain() == [Outcome.AWAITING_APPROVAL]
    waiting = h.run(run_id)
    assert waiting.status == RunStatus.AWAITING_APPROVAL
    [pending] = waiting.approvals
    assert pending.tool == "calculator" and pending.decision is None

    approvals.record_decision(h.store, run_id, pending.call_id, True, "test", None, h.dispatch.next_step)
    assert h.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert h.run(run_id).status == RunStatus.SUCCEEDED
    assert h.steps(run_id)[0].observations[0].content == "42"


def test_the_same_tool_runs_at_once_for_a_plan_that_does_not_name_it(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    h.llm.script(call("calculator", {"expression": "6 * 7"}), final("42"))
    run_id = h.submit("What is 6 * 7?")
    assert h.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert h.run(run_id).approvals == []


def test_a_run_cancelled_while_awaiting_approval_is_counted_once(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(approval_tools=["calculator"])
    h.llm.script(call("calculator", {"expression": "6 * 7"}))
    run_id = h.submit("What is 6 * 7?")
    assert h.drain() == [Outcome.AWAITING_APPROVAL]
    cancelled_before = metrics.RUNS_TOTAL.labels("cancelled")._value.get()

    assert cancel(h.store, run_id, h.dispatch.next_step).status == RunStatus.CANCELLED
    assert list(h.dispatch.steps) == [(run_id, 0)]  # a worker is woken to record it
    assert h.drain() == [Outcome.FENCED]
    assert h.run(run_id).cancel_recorded
    assert metrics.RUNS_TOTAL.labels("cancelled")._value.get() == cancelled_before + 1
    cancel(h.store, run_id, h.dispatch.next_step)  # cancelling again changes nothing
    assert not h.dispatch.steps
