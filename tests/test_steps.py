"""The step path in process (tests/harness.py): fencing, redelivery, leases, cancel, sandbox continuation,
compaction, reflection. Real RunStore on the real redis-server; the model is scripted at its seam."""

from __future__ import annotations

import time
from typing import Any

from tests.harness import Harness, call, calls, final
from tests.store_helpers import lease_held, save_reply
from tools_sandbox import ExecuteRequest, SandboxResult
from worker import metrics
from worker.core.models import LLMReply, RunStatus, Usage
from worker.core.outcome import Outcome
from worker.core.prompts import REFLECTION
from worker.errors import LLMError
from worker.names import STEP_TASK, STEPS_QUEUE
from worker.runtime.runner import Dispatcher
from worker.service.submit import cancel

SIX_BY_SEVEN = call("calculator", {"expression": "6*7"})


def test_a_run_calls_a_tool_then_answers(harness: Harness) -> None:
    harness.llm.script(SIX_BY_SEVEN, final("42"))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    run = harness.run(run_id)
    assert (run.status, run.answer, run.current_step) == (RunStatus.SUCCEEDED, "42", 2)
    steps = harness.steps(run_id)
    assert [s.index for s in steps] == [0, 1]
    assert steps[0].observations[0].content == "42"
    assert run.usage == Usage(prompt_tokens=20, completion_tokens=10)
    # the second turn saw the first one's call and its observation
    assert harness.llm.requests[1][-1] == {"role": "tool", "tool_call_id": "c1", "content": "42"}


def test_a_step_the_run_has_moved_past_is_fenced_without_asking_the_model(harness: Harness) -> None:
    harness.llm.script(SIX_BY_SEVEN, final("42"))
    run_id = harness.submit("What is 6 * 7?")
    harness.drain()
    assert harness.deliver(run_id, 0).outcome == Outcome.FENCED  # the run is finished
    assert harness.deliver(run_id, 5).outcome == Outcome.FENCED
    assert harness.deliver("no-such-run", 0).outcome == Outcome.FENCED
    assert len(harness.llm.requests) == 2 and len(harness.steps(run_id)) == 2


def test_a_step_ahead_of_the_run_is_fenced(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")
    assert harness.deliver(run_id, 1).outcome == Outcome.FENCED
    assert harness.llm.requests == [] and harness.run(run_id).current_step == 0


def test_a_step_delivered_twice_in_a_row_is_recorded_once(harness: Harness) -> None:
    harness.llm.script(SIX_BY_SEVEN, final("42"))
    run_id = harness.submit("What is 6 * 7?")
    first = harness.step()
    assert first.outcome == Outcome.TOOL_CALLS and first.next_step == 1
    assert harness.deliver(run_id, 0).outcome == Outcome.FENCED  # the duplicate, after the first committed
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    assert [s.index for s in harness.steps(run_id)] == [0, 1]
    assert harness.dispatch.sent_steps == [(run_id, 0), (run_id, 1)]  # step 1 was enqueued once
    assert len(harness.llm.requests) == 2


def test_a_duplicate_arriving_while_the_step_runs_backs_off_then_is_fenced(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")
    during: list[Outcome] = []

    def reply_while_a_duplicate_arrives(messages: list[dict[str, Any]]) -> LLMReply:
        during.append(harness.deliver(run_id, 0).outcome)  # the same step, delivered meanwhile
        return SIX_BY_SEVEN

    harness.llm.script(reply_while_a_duplicate_arrives, final("42"))
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert during == [Outcome.BUSY]
    assert harness.deliver(run_id, 0).outcome == Outcome.FENCED  # Celery's retry of the busy duplicate
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    assert len(harness.llm.requests) == 2 and len(harness.steps(run_id)) == 2


def test_a_redelivered_step_reuses_the_reply_a_dead_worker_stored(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")
    save_reply(harness.store, run_id, 0, SIX_BY_SEVEN)  # stored, then the worker died before recording
    harness.llm.script(final("42"))
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert len(harness.llm.requests) == 1  # only step 1 asked the model
    assert harness.steps(run_id)[0].tool_calls[0].name == "calculator"


def test_a_step_whose_run_lease_is_held_is_busy_and_does_nothing(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")
    harness.dispatch.steps.clear()
    assert harness.rt.leases.store.lease_and_load(run_id, 0, "another-worker", 15_000).acquired
    result = harness.deliver(run_id, 0)
    assert (result.outcome, result.next_step) == (Outcome.BUSY, None)
    assert harness.llm.requests == [] and harness.dispatch.sent_steps == [(run_id, 0)]
    assert lease_held(harness.store, run_id)  # the other holder's lease is untouched
    harness.rt.leases.store.release(run_id, "another-worker")
    harness.llm.script(final("42"))
    assert harness.deliver(run_id, 0).outcome == Outcome.FINAL_ANSWER


def test_the_commit_that_records_a_step_sends_the_next_one_and_a_refused_commit_sends_none(
        harness: Harness) -> None:
    """With a dispatcher that hands its message back (Celery on Redis), the next step is written by the
    step's commit, with the lease's release; a commit the record refuses (a cancel while the model was
    asked) writes no next step."""
    harness.llm.script(SIX_BY_SEVEN)
    run_id = harness.submit("What is 6 * 7 + 1?")
    first = harness.step()
    assert (first.outcome, first.next_step, first.next_sent) == (Outcome.TOOL_CALLS, 1, True)
    assert list(harness.dispatch.steps) == [(run_id, 1)] and not lease_held(harness.store, run_id)

    def cancelled_meanwhile(messages: list[dict[str, Any]]) -> LLMReply:
        cancel(harness.store, run_id)
        return call("calculator", {"expression": "42+1"}, call_id="c2")

    harness.llm.script(cancelled_meanwhile)
    assert harness.step().outcome == Outcome.FENCED
    assert harness.dispatch.sent_steps == [(run_id, 0), (run_id, 1)]  # no step 2
    assert harness.run(run_id).status == RunStatus.CANCELLED and len(harness.steps(run_id)) == 1


def test_the_next_step_is_enqueued_only_after_the_lease_is_released(harness: Harness) -> None:
    lease_held_when_sent: list[bool] = []
    record = harness.dispatch.next_step

    def next_step(run_id: str, index: int) -> None:
        lease_held_when_sent.append(lease_held(harness.store, run_id))
        record(run_id, index)

    # a dispatcher that cannot hand a message back (kombu's own transports): sent after the commit
    harness.runner.dispatch = Dispatcher(next_step=next_step, sandbox=harness.dispatch.send_sandbox,
                                         webhook=harness.runner.dispatch.webhook)
    harness.llm.script(SIX_BY_SEVEN, call("calculator", {"expression": "42+1"}, call_id="c2"), final("43"))
    harness.submit("What is 6 * 7 + 1?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert lease_held_when_sent == [False, False]


def test_a_cancelled_run_stops_before_its_next_step_and_is_counted_once(harness: Harness) -> None:
    harness.llm.script(SIX_BY_SEVEN)
    run_id = harness.submit("What is 6 * 7?")
    assert harness.step().outcome == Outcome.TOOL_CALLS
    cancel(harness.store, run_id)
    assert harness.drain() == [Outcome.FENCED]
    run = harness.run(run_id)
    assert run.status == RunStatus.CANCELLED and run.cancel_recorded
    assert len(harness.steps(run_id)) == 1 and len(harness.llm.requests) == 1


def test_a_run_cancelled_while_its_model_call_is_in_flight_records_nothing(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")

    def cancelled_meanwhile(messages: list[dict[str, Any]]) -> LLMReply:
        cancel(harness.store, run_id)
        return SIX_BY_SEVEN

    harness.llm.script(cancelled_meanwhile)
    assert harness.drain() == [Outcome.FENCED]
    run = harness.run(run_id)
    assert run.status == RunStatus.CANCELLED and harness.steps(run_id) == []
    assert run.usage == Usage()  # the fenced-out reply's tokens are not the run's
    assert not harness.dispatch.steps


def complete_sandbox(harness: Harness, request: dict[str, Any], result: SandboxResult) -> None:
    """What the sandbox worker does: validate the request, store the result object where it says."""
    req = ExecuteRequest.model_validate(request)
    harness.rt.redis.set(req.result_key, result.model_dump_json())


def test_a_sandboxed_call_waits_for_its_result_and_the_continuation_finishes_the_step(harness: Harness) -> None:
    harness.llm.script(call("python", {"code": "print(6*7)"}), final("42"))
    run_id = harness.submit("Use python to compute 6 * 7", tier="pro", tenant="acme")
    assert harness.drain() == [Outcome.WAITING]
    [request] = harness.dispatch.sandbox
    assert request["code"] == "print(6*7)" and (request["tier"], request["tenant"]) == ("pro", "acme")
    assert (request["continue_task"], request["continue_args"], request["continue_queue"]) == (
        STEP_TASK, [run_id, 0], STEPS_QUEUE)
    assert harness.run(run_id).waiting_on == "sandbox"
    # the message's argument is what steps have always sent (a sandbox worker of any version reads it)
    assert list(request) == ["code", "tier", "tenant", "result_key", "continue_task", "continue_args",
                             "continue_queue", "deadline_at", "queued_at", "pending_key"]
    assert ExecuteRequest.model_validate(request).wire() == request

    # the continuation (or a redelivery) before the result: still waiting, not sent twice
    assert harness.deliver(run_id, 0).outcome == Outcome.WAITING
    assert len(harness.dispatch.sandbox) == 1 and len(harness.llm.requests) == 1

    complete_sandbox(harness, request, SandboxResult(exit_code=0, stdout="42\n", stderr="", tier="pro",
                                                     backend="process"))
    assert harness.deliver(*request["continue_args"]).outcome == Outcome.TOOL_CALLS
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    [first, _] = harness.steps(run_id)
    assert first.observations[0].content == "42" and first.observations[0].outcome == "ok"
    run = harness.run(run_id)
    assert (run.status, run.answer, run.waiting_on) == (RunStatus.SUCCEEDED, "42", None)


def test_a_continuation_that_goes_on_runs_the_next_step_itself_and_a_delivery_asks_the_model_once(
        harness: Harness) -> None:
    """With go_on (what the Celery task asks), a delivery that records a stored reply's step enqueues nothing
    and says go_on; a delivery that asked the model enqueues the next step as always, so no delivery makes
    two model calls (docs/decisions/fair-queues.md)."""
    harness.llm.script(call("python", {"code": "print(6*7)"}), call("python", {"code": "print(7*6)"}), final("42"))
    run_id = harness.submit("Use python twice")
    assert harness.runner.run_step(run_id, 0, go_on=True).outcome == Outcome.WAITING
    harness.dispatch.steps.clear()
    [request] = harness.dispatch.sandbox
    complete_sandbox(harness, request, SandboxResult(exit_code=0, stdout="42\n", stderr="", tier="standard",
                                                     backend="process"))
    sent = len(harness.dispatch.sent_steps)
    continued = harness.runner.run_step(run_id, 0, go_on=True)
    assert (continued.outcome, continued.next_step, continued.go_on) == (Outcome.TOOL_CALLS, 1, True)
    assert len(harness.dispatch.sent_steps) == sent and not harness.dispatch.steps  # step 1 is not enqueued
    assert len(harness.llm.requests) == 1 and harness.run(run_id).current_step == 1

    # step 1 asks the model: even with go_on it waits on its own sandboxed call, nothing more
    assert harness.runner.run_step(run_id, 1, go_on=True).outcome == Outcome.WAITING
    assert len(harness.llm.requests) == 2
    complete_sandbox(harness, harness.dispatch.sandbox[-1],
                     SandboxResult(exit_code=0, stdout="42\n", stderr="", tier="standard", backend="process"))
    # without go_on (an older worker, the test harness) the continuation enqueues the next step
    assert harness.runner.run_step(run_id, 1).go_on is False
    assert list(harness.dispatch.steps) == [(run_id, 2)]
    assert harness.drain() == [Outcome.FINAL_ANSWER]


def test_a_delivery_that_asked_the_model_never_goes_on(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}), final("42"))
    run_id = harness.submit("What is 6 * 7?")
    harness.dispatch.steps.clear()
    first = harness.runner.run_step(run_id, 0, go_on=True)
    assert (first.outcome, first.go_on) == (Outcome.TOOL_CALLS, False)
    assert list(harness.dispatch.steps) == [(run_id, 1)]


def test_parallel_calls_mix_inline_and_sandboxed_results_in_the_order_asked(harness: Harness) -> None:
    harness.llm.script(calls(("python", {"code": "print(1)"}, "p"), ("calculator", {"expression": "2+2"}, "c")),
                       final("done"))
    run_id = harness.submit("both")
    assert harness.drain() == [Outcome.WAITING]
    [request] = harness.dispatch.sandbox
    complete_sandbox(harness, request, SandboxResult(exit_code=1, stdout="", stderr="Boom", tier="standard",
                                                     backend="process"))
    assert harness.deliver(run_id, 0).outcome == Outcome.TOOL_CALLS
    harness.drain()
    observations = harness.steps(run_id)[0].observations
    assert [o.call_id for o in observations] == ["p", "c"]
    assert observations[0].outcome == "error" and "Boom" in observations[0].content
    assert observations[1].content == "4"


def test_two_sandboxed_calls_whose_results_come_one_at_a_time_are_each_read_and_counted_once(
        harness: Harness) -> None:
    """The first continuation finds one result and waits on: that result is stored as the step's, so the
    second continuation takes it up as it is instead of reading the sandbox's object (and counting it) again."""
    harness.llm.script(calls(("python", {"code": "print(1)"}, "p1"), ("python", {"code": "print(2)"}, "p2")),
                       final("done"))
    run_id = harness.submit("both", tier="pro", tenant="acme")
    assert harness.drain() == [Outcome.WAITING]
    first, second = harness.dispatch.sandbox
    ok = metrics.TOOL_CALLS.labels("python", "ok")._value.get()
    complete_sandbox(harness, first, SandboxResult(exit_code=0, stdout="1\n", stderr="", tier="pro",
                                                   backend="process"))
    assert harness.deliver(run_id, 0).outcome == Outcome.WAITING
    assert metrics.TOOL_CALLS.labels("python", "ok")._value.get() == ok + 1
    harness.rt.redis.delete(ExecuteRequest.model_validate(first).result_key)  # only the step's copy is left
    complete_sandbox(harness, second, SandboxResult(exit_code=0, stdout="2\n", stderr="", tier="pro",
                                                    backend="process"))
    assert harness.deliver(run_id, 0).outcome == Outcome.TOOL_CALLS
    assert metrics.TOOL_CALLS.labels("python", "ok")._value.get() == ok + 2
    assert [o.content for o in harness.steps(run_id)[0].observations] == ["1", "2"]
    assert harness.drain() == [Outcome.FINAL_ANSWER]


def test_older_steps_are_compacted_to_fit_the_context_budget(make_harness: Any) -> None:
    harness = make_harness(context_budget_tokens=500, keep_recent_steps=1, max_steps=12)
    numbers = range(1, 7)
    harness.llm.script(*[call("calculator", {"expression": f"{n} * 1111111 + {'9' * 300}"}, call_id=f"c{n}")
                         for n in numbers], final("done"))
    run_id = harness.submit("Add some big numbers")
    outcomes = harness.drain()
    assert outcomes == [Outcome.TOOL_CALLS] * 6 + [Outcome.FINAL_ANSWER]
    last = harness.llm.requests[-1]
    summary = [m for m in last if str(m.get("content", "")).startswith("Summary of earlier steps")]
    assert len(summary) == 1
    assert all(f"step {n}:" in summary[0]["content"] for n in range(1, 6))  # every older step keeps a line
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["c6"]  # the latest step verbatim
    assert harness.run(run_id).status == RunStatus.SUCCEEDED


def test_a_prose_reply_to_the_reflection_prompt_is_a_thought_and_the_run_goes_on(make_harness: Any) -> None:
    harness = make_harness(reflect_every=1)
    harness.llm.script(SIX_BY_SEVEN, final("So far 6*7 = 42; next I add 1."),
                       call("calculator", {"expression": "42+1"}, call_id="c2"),
                       final("I have 43, which answers the question."), final("43"))
    run_id = harness.submit("What is 6 * 7 + 1?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.REFLECTION, Outcome.TOOL_CALLS, Outcome.REFLECTION,
                               Outcome.FINAL_ANSWER]
    run = harness.run(run_id)
    assert (run.status, run.answer) == (RunStatus.SUCCEEDED, "43")
    steps = harness.steps(run_id)
    assert [s.reflection for s in steps] == [False, True, False, True, False]
    assert steps[1].thought == "So far 6*7 = 42; next I add 1." and steps[1].final_answer is None
    # the reflection was asked for, and its exchange stays in the conversation
    assert harness.llm.requests[1][-1] == {"role": "user", "content": REFLECTION}
    assert harness.llm.requests[2][-2:] == [{"role": "user", "content": REFLECTION},
                                            {"role": "assistant", "content": "So far 6*7 = 42; next I add 1."}]


def test_the_llm_failing_for_good_ends_the_run_with_the_reason(harness: Harness) -> None:
    harness.llm.script(LLMError("LLM call to http://x failed after 3 attempt(s): HTTP 503: down", 3))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.LLM_FAILED]
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and "3 attempt(s)" in (run.error or "")


def test_invalid_outputs_in_a_row_end_the_run_with_their_safeguard(make_harness: Any) -> None:
    harness = make_harness(best_effort_answer=False)
    harness.llm.script(*[final("")] * 3)
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.INVALID_OUTPUT, Outcome.INVALID_OUTPUT, Outcome.ENDED]
    assert harness.outcomes[-1][2].safeguard == "invalid_outputs"
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and run.answer is None and not run.partial


def test_the_step_cap_ends_the_run_with_its_safeguard(make_harness: Any) -> None:
    harness = make_harness(best_effort_answer=False)
    harness.llm.script(SIX_BY_SEVEN)
    run_id = harness.submit("What is 6 * 7?", max_steps=1)
    assert harness.drain() == [Outcome.TOOL_CALLS]
    assert harness.outcomes[-1][2].safeguard == "max_steps" and harness.outcomes[-1][2].next_step is None
    run = harness.run(run_id)
    assert run.status == RunStatus.MAX_STEPS and run.answer is None and not run.partial
    assert len(harness.llm.requests) == 1  # switched off: no last call


def test_time_spent_waiting_in_the_queue_does_not_use_up_the_deadline(make_harness: Any) -> None:
    harness = make_harness(run_deadline_s=2)
    run_id = harness.submit("What is 6 * 7?")

    def queued_long_ago(run: Any) -> None:
        run.created_at -= 3600

    harness.store.update_run(run_id, queued_long_ago)
    assert harness.run(run_id).deadline_at is None
    harness.llm.script(SIX_BY_SEVEN, final("42"))
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    run = harness.run(run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.deadline_at is not None and run.deadline_at > time.time()  # counted from the first step


def test_a_deadline_passed_before_a_step_ends_the_run_without_asking(make_harness: Any) -> None:
    harness = make_harness()
    harness.llm.script(SIX_BY_SEVEN)
    run_id = harness.submit("What is 6 * 7?")
    harness.step()

    def past_deadline(run: Any) -> None:
        run.deadline_at = time.time() - 1

    harness.store.update_run(run_id, past_deadline)
    result = harness.step()
    assert (result.outcome, result.safeguard) == (Outcome.ENDED, "deadline")
    assert harness.run(run_id).status == RunStatus.TIMEOUT and len(harness.llm.requests) == 1


def test_a_step_commits_even_when_its_run_record_changed_underneath_without_fencing_it(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")

    def record_touched_meanwhile(messages: list[dict[str, Any]]) -> LLMReply:
        harness.store.update_run(run_id, lambda run: None)  # any write: the step's compare-and-set misses
        return SIX_BY_SEVEN

    harness.llm.script(record_touched_meanwhile, final("42"))
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert [s.index for s in harness.steps(run_id)] == [0, 1] and harness.run(run_id).answer == "42"
    assert not lease_held(harness.store, run_id)
