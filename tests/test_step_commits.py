"""The step path in process (tests/harness.py), at its commit: the last step's one write (trimmed keys,
compacted events), the lease let go, stored tool results and the tool cache reused, and what a tenant
without budgets is charged, and when. Real RunStore on the real redis-server; the model is scripted at its seam."""

from __future__ import annotations

import json
import threading
from typing import Any

import redis

from tests.harness import HARNESS_SETTINGS, Harness, call, final
from tests.store_helpers import lease_held, save_reply
from tests.test_steps import SIX_BY_SEVEN, complete_sandbox
from tests.waiting import wait_for
from tools_sandbox.base.models import SandboxResult
from worker.config import Settings
from worker.core.models import LLMReply, Observation, RunSpec, RunStatus, Step
from worker.core.outcome import Outcome
from worker.service.submit import submit
from worker.store import keys
from worker.store.cas import STREAM_LINGER_MS
from worker.store.events import event_command


def event_kinds(harness: Harness, run_id: str) -> list[str]:
    """A finished run's event types, from its compacted events (its stream expires in moments)."""
    assert 0 < harness.store.r.pttl(keys.events(run_id)) <= STREAM_LINGER_MS
    raw = harness.store.r.get(keys.events_compacted(run_id))
    assert raw is not None, f"run {run_id} has no compacted events"
    return [kind for _, kind, _ in json.loads(raw)]


def counting_harness(redis_url: str, sent: list[bytes]) -> tuple[Harness, redis.Redis]:
    """A harness whose runner's round trips are appended to `sent` (each one's first command and key)."""

    class Counting(redis.connection.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            packed = b"".join(command) if isinstance(command, list) else command
            sent.append(b" ".join(packed.split(b"\r\n")[2::2][:2]))  # each command's name and first key
            super().send_packed_command(command, check_health)

    client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(redis_url, connection_class=Counting))
    return Harness(Settings(redis_url=redis_url, **HARNESS_SETTINGS), redis_client=client), client


def test_the_last_step_of_a_batch_run_ends_it_in_one_write(redis_url: str) -> None:
    """Recording the step, ending the run, dropping its working keys, compacting its events and reading
    its batch's progress are one script: a run that is not its batch's last finishes in two round trips,
    the lease read and the commit."""
    sent: list[bytes] = []
    harness, client = counting_harness(redis_url, sent)
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
        harness.store.update_run(run_id, lambda run: None)  # any write: the step's compare-and-set misses
        harness.store.scratch.save_tool_result(run_id, 0,
                                               Observation(call_id="s1", tool="search", content="a working key"))
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
    assert not lease_held(harness.store, run_id) and harness.rt.leases.held() == []


def test_a_redelivered_step_reuses_the_tool_results_a_dead_worker_stored(harness: Harness) -> None:
    run_id = harness.submit("What is 6 * 7?")
    save_reply(harness.store, run_id, 0, SIX_BY_SEVEN)
    harness.store.scratch.save_tool_result(run_id, 0,
                                           Observation(call_id="c1", tool="calculator", content="42 (stored)"))
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
    assert list(harness.store.r.scan_iter(keys.tool_cache("*", "calculator", "*"))) == []


def test_a_step_calling_only_idempotent_inline_tools_stores_no_reply_before_acting(harness: Harness) -> None:
    """Nothing outside the run record happens: the reply is recorded with the step, in one write."""
    harness.llm.script(SIX_BY_SEVEN, final("42"))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert harness.store.scratch.get_reply(run_id, 0) is None
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


# --- what a tenant without budgets is charged: each call once, when its run ends (a stored reply's and a
# fenced step's at once) ---------------------------------------------------------------------------------
def day_spend(harness: Harness, tenant: str = "default") -> int:
    return harness.rt.budgets.spend(tenant)[0].tokens


def test_every_call_is_charged_once_to_the_tenants_day_and_month_when_the_run_ends(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}, tokens=100), final("42", tokens=40))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert day_spend(harness) == 0 and harness.run(run_id).uncounted.spend_tokens == 150  # type: ignore[union-attr]
    assert harness.drain() == [Outcome.FINAL_ANSWER]
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


def test_a_tenant_with_a_budget_is_charged_each_call_at_once_and_not_again_when_the_run_ends(
        harness: Harness) -> None:
    tenant = harness.rt.tenants.add("metered", "standard")
    harness.rt.tenants.set("metered", overrides={"tokens_per_day": 1_000_000})
    harness.llm.script(call("calculator", {"expression": "6*7"}, tokens=100), final("42", tokens=40))
    run_id = harness.submit("What is 6 * 7?", tenant=tenant)
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert day_spend(harness, tenant) == 150  # the reservation, settled to what the call cost
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    assert day_spend(harness, tenant) == 150 + 60 and harness.run(run_id).uncounted.spend_tokens == 0  # type: ignore[union-attr]
    assert harness.store.r.hget(keys.tenant_usage(tenant), "prompt_tokens") == b"140"  # counted at the end


def test_a_run_ended_without_a_step_counts_what_its_recorded_steps_used(harness: Harness) -> None:
    """A cancel (any end that records no step) counts the run's recorded steps on its tenant, in its write."""
    harness.llm.script(call("calculator", {"expression": "6*7"}, tokens=100))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert harness.store.finish(run_id, RunStatus.CANCELLED, "cancelled by the test") is not None
    assert day_spend(harness) == 150
    assert harness.store.r.hmget(keys.tenant_usage("default"), "prompt_tokens", "completion_tokens") == [b"100", b"50"]


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


def test_a_step_that_sends_its_code_to_the_sandbox_takes_three_round_trips_and_its_continuation_three(
        redis_url: str) -> None:
    """The lease and the reads; the reply stored (with the call's charge); the wait written with the call's
    dispatch claimed and the lease let go. With the reply stored by this delivery, no result can be waiting
    for its call and no other delivery sent it: neither is looked for. A later delivery acting on the stored
    reply looks for the result, does not send the call again, and once the result is there records it with
    the step, in the commit."""
    sent: list[bytes] = []
    harness, _ = counting_harness(redis_url, sent)
    try:
        harness.llm.script(*[call("python", {"code": "print(6*7)"}, call_id="p1")] * 2, final("42"))
        harness.submit("Use python to load the scripts", tier="pro", tenant="acme")
        run_id = harness.submit("Use python to compute 6 * 7", tier="pro", tenant="acme")
        assert harness.step().outcome == Outcome.WAITING  # the first run's: Redis loads the scripts
        sent.clear()
        assert harness.step().outcome == Outcome.WAITING
        result_key = keys.sandbox_result(run_id, 0, "p1").encode()
        assert len(sent) == 3, sent
        assert not any(result_key in command for command in sent)
        assert harness.store.r.exists(keys.sandbox_dispatch(run_id, 0, "p1"))
        assert not lease_held(harness.store, run_id)
        assert harness.run(run_id).waiting_on == "sandbox"
        sent.clear()
        assert harness.deliver(run_id, 0).outcome == Outcome.WAITING  # its result not stored yet
        assert any(command == b"GET " + result_key for command in sent)
        [_, request] = harness.dispatch.sandbox  # the claim holds: sent once
        complete_sandbox(harness, request, SandboxResult(exit_code=0, stdout="42\n", stderr="", tier="pro",
                                                         backend="process"))
        sent.clear()
        assert harness.deliver(run_id, 0).outcome == Outcome.TOOL_CALLS
        assert len(sent) == 3, sent  # the lease and the reads; the result; the commit, which records it
        assert harness.step().outcome == Outcome.FINAL_ANSWER
        assert harness.run(run_id).answer == "42"
    finally:
        harness.close()


def test_compacted_events_point_at_each_step_by_its_index(harness: Harness) -> None:
    """The compaction reads a step event's index from the head of its data (two digits and more too)."""
    run_id = harness.submit("What is 6 * 7?")
    events = keys.events(run_id)
    for index in (0, 9, 12, 345):
        harness.store.r.execute_command(*event_command(run_id, "step", Step(index=index).model_dump_json()))
    harness.store.drop_and_compact(run_id, [])
    compacted = json.loads(harness.store.r.get(keys.events_compacted(run_id)))
    assert [(kind, data) for _, kind, data in compacted] == [
        ("queued", "{}"), ("step", 0), ("step", 9), ("step", 12), ("step", 345)]
    assert 0 < harness.store.r.pttl(events) <= STREAM_LINGER_MS


def test_a_moving_runs_keys_get_their_expiry_again_once_a_period_not_on_every_step(harness: Harness) -> None:
    """The submission gives the run's keys their expiry with two refresh periods to spare, the first step
    its step list's; a step in the same period leaves them; the first write in a later period sets them
    again."""
    harness.llm.script(*[call("search", {"query": q}, call_id=q) for q in "abc"], final("42"))
    run_id = harness.submit("What is 6 * 7?")
    store, moving = harness.store, [keys.run(run_id), keys.steps(run_id), keys.events(run_id)]
    store.r.expire(keys.run(run_id), 1000)
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert 0 < store.r.ttl(keys.run(run_id)) <= 1000
    assert all(store.ttl + store.refresh_every < store.r.ttl(k) <= store.moving_ttl for k in moving[1:])
    for k in moving:
        store.r.expire(k, 1000)
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert all(0 < store.r.ttl(k) <= 1000 for k in moving)
    record = harness.run(run_id)
    record.updated_at -= store.refresh_every  # its last write a period ago
    store.r.set(keys.run(run_id), record.model_dump_json(), keepttl=True)
    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert all(store.ttl < store.r.ttl(k) for k in moving)


def test_a_batch_and_its_tenant_count_a_runs_usage_once_when_it_ends(harness: Harness) -> None:
    harness.llm.script(call("search", {"query": "x"}, call_id="s1", tokens=100), final("42", tokens=40))
    [run] = submit(harness.store, [RunSpec(question="What is 6 * 7?")], harness.rt.settings,
                   harness.dispatch.next_step, batch_id="b-usage", tenants=harness.rt.tenants,
                   budgets=harness.rt.budgets)

    def usage(key: str) -> list[Any]:
        return harness.store.r.hmget(key, "prompt_tokens", "completion_tokens")

    assert harness.step().outcome == Outcome.TOOL_CALLS
    assert usage(keys.tenant_usage("default")) == usage(keys.batch("b-usage")) == [None, None]
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    assert harness.run(run.id).usage.prompt_tokens == 140
    assert usage(keys.tenant_usage("default")) == usage(keys.batch("b-usage")) == [b"140", b"70"]


def test_a_run_that_ends_its_batch_after_the_webhook_was_claimed_reads_the_batch_once(redis_url: str) -> None:
    """A run that finishes its batch again (one moved into it after the batch's end) finds the webhook
    claimed in the same round trip as the batch's record, and stops there."""
    sent: list[bytes] = []
    harness, _ = counting_harness(redis_url, sent)
    try:
        harness.llm.script(final("42"), final("43"))
        submit(harness.store, [RunSpec(question="What is 6 * 7?")], harness.rt.settings, harness.dispatch.next_step,
               batch_id="b-claimed", tenants=harness.rt.tenants, budgets=harness.rt.budgets)
        assert harness.drain() == [Outcome.FINAL_ANSWER]
        assert harness.store.r.exists(keys.batch_webhook_sent("b-claimed"))
        [late] = submit(harness.store, [RunSpec(question="And 6 * 8?")], harness.rt.settings,
                        harness.dispatch.next_step, batch_id="b-claimed", tenants=harness.rt.tenants,
                        budgets=harness.rt.budgets)
        sent.clear()
        assert harness.drain() == [Outcome.FINAL_ANSWER]
        assert len(sent) == 3, sent  # the lease and the reads; the commit; the batch's record and marker
        assert sent[-1] == b"HGETALL " + keys.batch("b-claimed").encode()
        assert harness.store.batches.progress("b-claimed") == (2, 2) and harness.run(late.id).answer == "43"
    finally:
        harness.close()


def test_a_batch_run_ending_soon_after_it_joined_refreshes_only_the_batch_keys_it_may_make(harness: Harness) -> None:
    """Its submission gave the batch's keys a refresh period more than the batch's TTL: its end gives
    the finished list (which it makes) its expiry, and leaves the others'."""
    harness.llm.script(final("42"))
    submit(harness.store, [RunSpec(question="What is 6 * 7?")], harness.rt.settings, harness.dispatch.next_step,
           batch_id="b-kept", tenants=harness.rt.tenants, budgets=harness.rt.budgets)
    store = harness.store
    assert store.batch_ttl < store.r.ttl(keys.batch_runs("b-kept")) <= store.batch_kept
    store.r.expire(keys.batch_runs("b-kept"), 1000)
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    assert 0 < store.r.ttl(keys.batch_runs("b-kept")) <= 1000
    assert store.batch_ttl < store.r.ttl(keys.batch_done("b-kept")) <= store.batch_kept
