"""The step path in process (tests/harness.py): fencing, redelivery, leases, cancel, sandbox continuation,
compaction, reflection. Real RunStore on the real redis-server; the model is scripted at its seam."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import redis

from tests.harness import HARNESS_SETTINGS, Harness, call, calls, final
from tests.waiting import wait_for
from tools_sandbox.models import SandboxResult
from tools_sandbox.tasks import ExecuteRequest
from worker.config import Settings
from worker.core.models import LLMReply, Observation, RunSpec, RunStatus, Usage
from worker.core.outcome import Outcome
from worker.core.prompts import REFLECTION
from worker.errors import LLMError
from worker.names import STEP_TASK, STEPS_QUEUE
from worker.runtime.runner import Dispatcher
from worker.service.submit import cancel, submit
from worker.store import keys
from worker.store.cas import STREAM_LINGER_MS

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
    harness.store.save_reply(run_id, 0, SIX_BY_SEVEN)  # stored, then the worker died before recording
    harness.llm.script(final("42"))
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert len(harness.llm.requests) == 1  # only step 1 asked the model
    assert harness.steps(run_id)[0].tool_calls[0].name == "calculator"


def test_a_step_whose_run_lease_is_held_is_busy_and_does_nothing(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")
    harness.dispatch.steps.clear()
    assert harness.store.lease_and_load(run_id, 0, "another-worker", 15_000).acquired
    result = harness.deliver(run_id, 0)
    assert (result.outcome, result.next_step) == (Outcome.BUSY, None)
    assert harness.llm.requests == [] and harness.dispatch.sent_steps == [(run_id, 0)]
    assert harness.store.lease_held(run_id)  # the other holder's lease is untouched
    harness.store.release_lease(run_id, "another-worker")
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
    assert list(harness.dispatch.steps) == [(run_id, 1)] and not harness.store.lease_held(run_id)

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
        lease_held_when_sent.append(harness.store.lease_held(run_id))
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


def test_invalid_outputs_in_a_row_end_the_run_with_their_safeguard(harness: Harness) -> None:
    harness.llm.script(*[final("")] * 3)
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.INVALID_OUTPUT, Outcome.INVALID_OUTPUT, Outcome.ENDED]
    assert harness.outcomes[-1][2].safeguard == "invalid_outputs"
    assert harness.run(run_id).status == RunStatus.FAILED


def test_the_step_cap_ends_the_run_with_its_safeguard(harness: Harness) -> None:
    harness.llm.script(SIX_BY_SEVEN)
    run_id = harness.submit("What is 6 * 7?", max_steps=1)
    assert harness.drain() == [Outcome.TOOL_CALLS]
    assert harness.outcomes[-1][2].safeguard == "max_steps" and harness.outcomes[-1][2].next_step is None
    assert harness.run(run_id).status == RunStatus.MAX_STEPS


def test_time_spent_waiting_in_the_queue_does_not_use_up_the_deadline(make_harness: Any) -> None:
    harness = make_harness(run_deadline_s=2)
    run_id = harness.submit("What is 6 * 7?")

    def queued_long_ago(run: Any) -> bool:
        run.created_at -= 3600
        return True

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

    def past_deadline(run: Any) -> bool:
        run.deadline_at = time.time() - 1
        return True

    harness.store.update_run(run_id, past_deadline)
    result = harness.step()
    assert (result.outcome, result.safeguard) == (Outcome.ENDED, "deadline")
    assert harness.run(run_id).status == RunStatus.TIMEOUT and len(harness.llm.requests) == 1


def test_a_step_commits_even_when_its_run_record_changed_underneath_without_fencing_it(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")

    def record_touched_meanwhile(messages: list[dict[str, Any]]) -> LLMReply:
        harness.store.update_run(run_id, lambda run: True)  # any write: the step's compare-and-set misses
        return SIX_BY_SEVEN

    harness.llm.script(record_touched_meanwhile, final("42"))
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert [s.index for s in harness.steps(run_id)] == [0, 1] and harness.run(run_id).answer == "42"
    assert not harness.store.lease_held(run_id)


def event_kinds(harness: Harness, run_id: str) -> list[str]:
    """A finished run's event types, from its compacted events (its stream expires in moments)."""
    assert 0 < harness.store.r.pttl(keys.events(run_id)) <= STREAM_LINGER_MS
    raw = harness.store.r.get(keys.events_compacted(run_id))
    assert raw is not None, f"run {run_id} has no compacted events"
    return [kind for _, kind, _ in json.loads(raw)]


def test_the_last_step_of_a_batch_run_ends_it_in_one_write(redis_url: str) -> None:
    """Recording the step, ending the run, dropping its working keys, compacting its events and reading
    its batch's progress are one script: a run that is not its batch's last finishes in two round trips,
    the lease read and the commit."""
    sent: list[bytes] = []

    class Counting(redis.connection.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            packed = b"".join(command) if isinstance(command, list) else command
            sent.append(b" ".join(packed.split(b"\r\n")[2::2][:2]))  # each command's name and first key
            super().send_packed_command(command, check_health)

    client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(redis_url, connection_class=Counting))
    harness = Harness(Settings(redis_url=redis_url, **HARNESS_SETTINGS), redis_client=client)
    try:
        lookup = call("search", {"query": "x"}, call_id="s1")
        harness.llm.script(lookup, lookup, final("42"))
        first, _ = submit(harness.store, [RunSpec(question="What is 6 * 7?"), RunSpec(question="And 6 * 8?")],
                          harness.rt.settings, harness.dispatch.next_step, batch_id="b-one-write",
                          tenants=harness.rt.tenants, budgets=harness.rt.budgets)
        assert [harness.step().outcome for _ in range(2)] == [Outcome.TOOL_CALLS, Outcome.TOOL_CALLS]
        sent.clear()
        assert harness.step().outcome == Outcome.FINAL_ANSWER
        assert len(sent) == 2, sent  # the lease and the reads; the commit
        assert event_kinds(harness, first.id) == ["queued", "step", "step", "finished"]
        assert sorted(client.keys(f"*{first.id}*")) == sorted(k.encode() for k in (
            keys.run(first.id), keys.steps(first.id), keys.events(first.id), keys.events_compacted(first.id)))
        assert harness.store.batches.progress("b-one-write") == (1, 2)
    finally:
        harness.close()


def test_a_subscriber_waiting_on_the_event_stream_gets_the_last_events_when_the_run_ends(harness: Harness) -> None:
    """The last step compacts the stream in its own script: the stream must outlive that script, or a
    reader blocked on it (the SSE route) would hear nothing until its read timed out."""
    harness.llm.script(call("search", {"query": "x"}, call_id="s1"), final("42"))
    run_id = harness.submit("What is 6 * 7?")
    harness.step()
    latest = harness.store.r.xrevrange(keys.events(run_id), count=1)[0][0]
    heard: list[Any] = []
    subscriber = redis.Redis.from_url(harness.rt.settings.redis_url, client_name="subscriber")
    reader = threading.Thread(target=lambda: heard.extend(subscriber.xread({keys.events(run_id): latest},
                                                                           block=30_000)))
    reader.start()
    wait_for("the subscriber to wait on the stream",
             lambda: any(c.get("name") == "subscriber" and c.get("cmd") == "xread"
                         for c in harness.store.r.client_list()), 30)
    assert harness.step().outcome == Outcome.FINAL_ANSWER
    reader.join()
    [(_, entries)] = heard
    assert [fields[b"type"] for _, fields in entries] == [b"step", b"finished"]


def test_a_last_step_whose_record_changed_meanwhile_still_trims_the_run(harness: Harness) -> None:
    """The commit's fallback (WATCH/MULTI) path drops the working keys and compacts the events too."""
    run_id = harness.submit("What is 6 * 7?")
    lookup = call("search", {"query": "x"}, call_id="s1")

    def record_touched_meanwhile(messages: list[dict[str, Any]]) -> LLMReply:
        harness.store.update_run(run_id, lambda run: True)  # any write: the step's compare-and-set misses
        harness.store.save_tool_result(run_id, 0, Observation(call_id="s1", tool="search", content="a working key"))
        return final("42")

    harness.llm.script(lookup, record_touched_meanwhile)
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert harness.run(run_id).answer == "42"
    assert event_kinds(harness, run_id) == ["queued", "step", "step", "finished"]
    assert not harness.store.r.exists(keys.tool_results(run_id, 0))


def test_the_commit_lets_go_of_the_lease(harness: Harness) -> None:
    harness.llm.script(SIX_BY_SEVEN)
    run_id = harness.submit("What is 6 * 7?")
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert not harness.store.lease_held(run_id) and harness.rt.leases.held() == []


def test_a_redelivered_step_reuses_the_tool_results_a_dead_worker_stored(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")
    harness.store.save_reply(run_id, 0, SIX_BY_SEVEN)
    harness.store.save_tool_result(run_id, 0, Observation(call_id="c1", tool="calculator", content="42 (stored)"))
    harness.llm.script(final("42"))
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert harness.steps(run_id)[0].observations[0].content == "42 (stored)"


def test_a_cached_tools_result_is_cached_with_the_step_and_reused_by_the_next_run(make_harness: Any) -> None:
    harness = make_harness(tool_cache_ttl_s=60)
    lookup = call("search", {"query": "capital of France"})
    harness.llm.script(lookup, final("Paris"), lookup, final("Paris"))
    first = harness.submit("What is the capital of France?")
    harness.drain()
    second = harness.submit("Which city is the capital of France?")
    harness.drain()
    assert harness.steps(first)[0].observations[0].outcome == "ok"
    assert harness.steps(second)[0].observations[0].outcome == "cached"
    assert harness.steps(second)[0].observations[0].content == harness.steps(first)[0].observations[0].content


def test_the_calculator_is_idempotent_but_not_cached(make_harness: Any) -> None:
    """Evaluating costs less than the cache's Redis lookup and write would."""
    harness = make_harness(tool_cache_ttl_s=60)
    harness.llm.script(SIX_BY_SEVEN, SIX_BY_SEVEN, final("42"), final("42"))
    first, second = harness.submit("What is 6 * 7?"), harness.submit("What is 6 times 7?")
    harness.drain()
    assert [harness.steps(r)[0].observations[0].outcome for r in (first, second)] == ["ok", "ok"]
    assert list(harness.store.r.scan_iter(keys.tool_cache("calculator", "*"))) == []


def test_a_step_calling_only_idempotent_inline_tools_stores_no_reply_before_acting(harness: Harness) -> None:
    """Nothing outside the run record happens: the reply is recorded with the step, in one write."""
    harness.llm.script(SIX_BY_SEVEN, final("42"))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert harness.store.get_reply(run_id, 0) is None
    [recorded] = harness.steps(run_id)[0].tool_calls
    assert (recorded.name, recorded.arguments) == ("calculator", {"expression": "6*7"})


def test_in_text_mode_a_reflection_is_a_thought_but_an_explicit_final_answer_still_ends_the_run(
    make_harness: Any,
) -> None:
    harness = make_harness(reflect_every=1, mode="text")
    action = LLMReply(content='Thought: compute\nAction: calculator\nAction Input: {"expression": "6*7"}')
    harness.llm.script(action, final("I have 42 so far; the approach works."),
                       LLMReply(content='Thought: add one\nAction: calculator\nAction Input: {"expression": "42+1"}'),
                       final("Thought: I now know the final answer\nFinal Answer: 43"))
    run_id = harness.submit("What is 6 * 7 + 1?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.REFLECTION, Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert (harness.run(run_id).status, harness.run(run_id).answer) == (RunStatus.SUCCEEDED, "43")
    assert harness.steps(run_id)[1].thought == "I have 42 so far; the approach works."


# --- what a tenant without budgets is charged: each call once, written with the step's reply ---------
def day_spend(harness: Harness, tenant: str = "default") -> int:
    return harness.rt.budgets.spend(tenant)[0].tokens


def test_every_call_is_charged_once_to_the_tenants_day_and_month(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}, tokens=100), final("42", tokens=40))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    run = harness.run(run_id)
    assert run.usage.prompt_tokens + run.usage.completion_tokens == 150 + 60
    day, month = harness.rt.budgets.spend("default")
    assert day.tokens == month.tokens == 210


def test_a_duplicate_call_is_charged_too_and_a_stored_reply_is_not_charged_again(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")

    def reply_while_a_duplicate_runs(messages: list[dict[str, Any]]) -> LLMReply:
        harness.rt.redis.delete(keys.lease(run_id))  # the lease expired: a duplicate runs the step
        assert harness.deliver(run_id, 0).outcome == Outcome.TOOL_CALLS
        return call("calculator", {"expression": "6*7"}, tokens=100)

    harness.llm.script(reply_while_a_duplicate_runs, call("calculator", {"expression": "6*7"}, tokens=100),
                       final("42", tokens=40))
    assert harness.step().outcome == Outcome.FENCED  # the duplicate stored its reply and recorded the step
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    assert day_spend(harness) == 150 + 150 + 60  # both calls of step 0 were made and paid for


def test_a_sandboxed_step_is_charged_when_it_sends_the_code_not_again_when_it_resumes(harness: Harness) -> None:
    harness.llm.script(call("python", {"code": "print(6*7)"}, tokens=100), final("42", tokens=40))
    run_id = harness.submit("Use python to compute 6 * 7", tier="pro", tenant="acme")
    assert harness.drain() == [Outcome.WAITING]
    assert day_spend(harness, "acme") == 150  # counted with the stored reply, before the result is back
    [request] = harness.dispatch.sandbox
    complete_sandbox(harness, request, SandboxResult(exit_code=0, stdout="42\n", stderr="", tier="pro",
                                                     backend="process"))
    harness.deliver(*request["continue_args"])
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    assert harness.run(run_id).status == RunStatus.SUCCEEDED
    assert day_spend(harness, "acme") == 150 + 60
