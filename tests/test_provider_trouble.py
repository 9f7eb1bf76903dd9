"""A provider in trouble is a wait, not a failed run: the pure decision (worker/core/provider_trouble.py), the
shared circuit on a real redis-server (worker/llm/circuit.py), and the step path in the harness."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from tests.harness import Harness, call, final
from worker.core.engine import End
from worker.core.models import LLMReply, Mode, Run, RunSpec, RunStatus, Usage
from worker.core.outcome import Outcome
from worker.core.provider_trouble import (
    TRANSIENT_OUTCOMES,
    WaitForProvider,
    after_failed_call,
    deadline_of,
)
from worker.errors import LLMError
from worker.llm.circuit import CircuitLLM
from worker.store import keys
from worker.store.provider_circuit import ProviderCircuits

PERMANENT = ["client_error", "error"]


def a_run(deadline_s: float | None = 100.0, deadline_at: float | None = None) -> Run:
    run = Run(spec=RunSpec(question="q"), model="m", mode=Mode.TOOLS, deadline_s=deadline_s)
    run.deadline_at = deadline_at
    return run


# --- the pure decision -------------------------------------------------------------------------------
@pytest.mark.parametrize("outcome", PERMANENT)
def test_a_refusal_no_retry_changes_fails_the_run_with_its_reason(outcome: str) -> None:
    move = after_failed_call(a_run(), 0.0, 1.0, outcome, "HTTP 400 (invalid_request_error)", 5.0)
    assert move == End(RunStatus.FAILED, "HTTP 400 (invalid_request_error)")


@pytest.mark.parametrize("outcome", sorted(TRANSIENT_OUTCOMES))
def test_a_provider_in_trouble_is_waited_for(outcome: str) -> None:
    assert after_failed_call(a_run(), 0.0, 1.0, outcome, "why", 5.0) == WaitForProvider(5.0)
    assert after_failed_call(a_run(deadline_s=None), 0.0, 1.0, outcome, "why", 500.0) == WaitForProvider(500.0)


def test_a_wait_that_would_reach_the_deadline_ends_the_run_timeout_with_the_providers_trouble() -> None:
    run = a_run(deadline_at=110.0)
    assert after_failed_call(run, 100.0, 104.0, "timeout", "why", 5.0) == WaitForProvider(5.0)
    end = after_failed_call(run, 100.0, 104.0, "connection_error", "APIConnectionError", 6.0)
    assert isinstance(end, End) and end.status == RunStatus.TIMEOUT and end.safeguard == "deadline"
    assert "model provider was unavailable (APIConnectionError)" in end.reason


def test_a_first_step_counts_its_deadline_from_its_own_start() -> None:
    run = a_run(deadline_s=10.0)  # no recorded step yet: no deadline_at
    assert deadline_of(run, 100.0) == 110.0 and deadline_of(a_run(deadline_s=None), 100.0) is None
    assert deadline_of(a_run(deadline_at=50.0), 100.0) == 50.0
    assert after_failed_call(run, 100.0, 108.0, "timeout", "why", 1.5) == WaitForProvider(1.5)
    assert isinstance(after_failed_call(run, 100.0, 108.0, "timeout", "why", 2.0), End)


@given(started=st.floats(0, 1e6), elapsed=st.floats(0, 1e4), deadline_s=st.floats(0.01, 1e4),
       wait_s=st.floats(0, 1e4), outcome=st.sampled_from(sorted(TRANSIENT_OUTCOMES)))
def test_a_wait_never_reaches_past_the_deadline(started: float, elapsed: float, deadline_s: float, wait_s: float,
                                                outcome: str) -> None:
    run = a_run(deadline_s=deadline_s)
    move = after_failed_call(run, started, started + elapsed, outcome, "why", wait_s)
    if isinstance(move, WaitForProvider):
        assert move.wait_s == wait_s and started + elapsed + move.wait_s < started + deadline_s
    else:
        assert move.status == RunStatus.TIMEOUT and started + elapsed + wait_s >= started + deadline_s


# --- the circuit, shared through a real Redis -----------------------------------------------------------
class Provider:
    """A model behind an endpoint: fails with `outcome` while `down`, else answers."""

    def __init__(self) -> None:
        self.down: str | None = None
        self.calls = 0

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> LLMReply:
        self.calls += 1
        if self.down is not None:
            raise LLMError(f"LLM call failed after 1 attempt(s): {self.down}", 1, self.down)
        return LLMReply(content="ok", usage=Usage(prompt_tokens=1, completion_tokens=1))


@pytest.fixture
def circuits(redis_url: str) -> ProviderCircuits:
    return ProviderCircuits(redis.Redis.from_url(redis_url))


def test_a_failing_provider_opens_its_circuit_for_every_worker_until_it_answers(circuits: ProviderCircuits) -> None:
    provider = Provider()
    worker_a = CircuitLLM(provider, circuits, base_s=0.3, cap_s=5.0, refresh_s=0.0)
    worker_b = CircuitLLM(provider, circuits, base_s=0.3, cap_s=5.0, refresh_s=0.0)
    provider.down = "connection_error"
    with pytest.raises(LLMError) as failed:
        worker_a.chat([], model="m")
    assert failed.value.retry_after_s == pytest.approx(0.3, abs=0.05) and 0 < circuits.open_ms("m") <= 300
    # worker B sends nothing while the circuit is open: it is told how long to wait
    with pytest.raises(LLMError) as refused:
        worker_b.chat([], model="m")
    assert refused.value.outcome == "circuit_open" and 0 < (refused.value.retry_after_s or 0) <= 0.3
    assert provider.calls == 1 and circuits.open_ms("m") > 0 and circuits.open_ms("other") == 0

    time.sleep(0.35)  # closed again: the next call goes out; another failure is a second round, twice as long
    with pytest.raises(LLMError) as again:
        worker_b.chat([], model="m")
    assert provider.calls == 2 and again.value.retry_after_s == pytest.approx(0.6, abs=0.05)
    # calls already in flight when it opened fail too: they do not make the wait longer
    assert circuits.trip("m", 300, 5000)[0] == 2 and circuits.open_ms("m") <= 600

    time.sleep(0.65)
    provider.down = None
    assert worker_a.chat([], model="m").content == "ok"
    r = circuits.r
    assert not r.exists(keys.llm_circuit("m"), keys.llm_failures("m"))  # the next outage starts at the base
    assert worker_b.chat([], model="m").content == "ok"


def test_a_refusal_does_not_open_the_circuit(circuits: ProviderCircuits) -> None:
    provider = Provider()
    provider.down = "client_error"
    guarded = CircuitLLM(provider, circuits, base_s=5.0, cap_s=5.0, refresh_s=0.0)
    for _ in range(3):
        with pytest.raises(LLMError):
            guarded.chat([], model="m")
    assert provider.calls == 3 and circuits.open_ms("m") == 0


def test_a_worker_reads_the_circuit_at_most_once_a_refresh(circuits: ProviderCircuits) -> None:
    provider, now = Provider(), [0.0]
    guarded = CircuitLLM(provider, circuits, base_s=5.0, cap_s=5.0, refresh_s=1.0, clock=lambda: now[0])
    assert guarded.chat([], model="m").content == "ok"
    circuits.trip("m", 5000, 5000)  # another worker saw the provider fail
    assert guarded.chat([], model="m").content == "ok"  # within the refresh: not read again
    now[0] = 1.0
    with pytest.raises(LLMError, match="circuit open"):
        guarded.chat([], model="m")
    assert provider.calls == 2


# --- the step path ---------------------------------------------------------------------------------------
def test_a_step_whose_provider_is_down_goes_back_to_the_queue_and_the_run_shows_it_waits(harness: Harness) -> None:
    harness.llm.script(LLMError("LLM call failed after 5 attempt(s): APIConnectionError", 5, "connection_error",
                                retry_after_s=4.0), call("calculator", {"expression": "6*7"}), final("42"))
    run_id = harness.submit("What is 6 * 7?")
    before = time.time()
    [waited] = [harness.step()]
    assert waited.outcome == Outcome.PROVIDER_WAIT and waited.retry_in_s == 4.0
    assert harness.dispatch.steps == type(harness.dispatch.steps)()  # nothing queued: the task re-sends it later
    run = harness.run(run_id)
    assert run.status == RunStatus.RUNNING and run.waiting_on == "provider" and run.error is None
    assert run.deadline_at is not None and before <= run.deadline_at - (run.deadline_s or 0) <= time.time()
    assert harness.steps(run_id) == []  # nothing recorded, nothing spent

    harness.deliver(run_id, 0)  # the provider is back
    assert harness.drain() == [Outcome.FINAL_ANSWER]
    run = harness.run(run_id)
    assert run.status == RunStatus.SUCCEEDED and run.answer == "42" and run.waiting_on is None


def test_a_bad_request_fails_the_run_with_its_reason(harness: Harness) -> None:
    harness.llm.script(LLMError("LLM call failed after 1 attempt(s): HTTP 400 (invalid_request_error)", 1,
                                "client_error"))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.LLM_FAILED]
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and run.error is not None and "HTTP 400" in run.error


def test_a_provider_down_until_the_deadline_ends_the_run_timeout(harness: Harness) -> None:
    def slow_then_down(messages: list[dict[str, Any]]) -> LLMReply:
        time.sleep(1.2)
        raise LLMError("LLM call failed after 2 attempt(s): APITimeoutError", 2, "timeout")

    harness.llm.script(slow_then_down)
    run_id = harness.submit("What is 6 * 7?", deadline_s=1.0)
    assert harness.drain() == [Outcome.LLM_FAILED]
    run = harness.run(run_id)
    assert run.status == RunStatus.TIMEOUT and "model provider was unavailable" in (run.error or "")
    # the call was told the run's deadline
    deadline = harness.llm.options[0]["deadline_at"]
    assert deadline is not None and abs(deadline - (run.created_at + 1.0)) < 5


# --- tokens of attempts that failed -----------------------------------------------------------------------
def test_the_tokens_of_failed_attempts_are_charged_with_the_reply_or_when_the_call_fails(harness: Harness) -> None:
    """A provider may bill an attempt that timed out mid-answer: its (estimated) tokens are in the step's cost
    and the tenant's spend, beside the reply's own; a call that failed altogether still charges them."""
    lost = Usage(prompt_tokens=300, completion_tokens=40, estimated=True)
    reply = final("42")
    reply.lost_usage = lost
    harness.llm.script(LLMError("LLM call failed after 2 attempt(s): APITimeoutError", 2, "timeout",
                                lost_usage=lost), reply)
    run_id = harness.submit("What is 6 * 7?")
    spend = harness.rt.budgets.store
    assert harness.step().outcome == Outcome.PROVIDER_WAIT
    assert spend.usage("default").get("prompt_tokens") == 300  # charged though nothing was recorded
    assert harness.deliver(run_id, 0).outcome == Outcome.FINAL_ANSWER
    [step] = harness.steps(run_id)
    assert step.lost_usage == lost and step.usage == reply.usage
    assert spend.usage("default")["prompt_tokens"] == 300 + 300 + reply.usage.prompt_tokens
    assert spend.usage("default")["completion_tokens"] == 40 + 40 + reply.usage.completion_tokens


def test_a_prompt_refused_as_too_large_even_compacted_ends_the_run_with_its_best_answer(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}),
                       LLMError("the conversation does not fit the model's context window", 2, "context_exceeded"),
                       final("It is 42."))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.BEST_EFFORT]
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and run.partial and run.answer == "It is 42.", run
    assert "context" in (run.error or "")
    assert harness.llm.options[-1].get("tool_choice") == "none"  # the last call asked for an answer, tools off
