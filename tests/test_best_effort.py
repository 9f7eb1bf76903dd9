"""The best-effort answer at a limit and loop control, through the real StepRunner and RunStore (the
in-process harness on a real redis-server): one last call with tools disabled, recorded as a step."""

from __future__ import annotations

from typing import Any

from tests.harness import Harness, call, final
from worker.core.models import LLMReply, Mode, RunStatus, Usage
from worker.core.outcome import Outcome
from worker.core.views import run_json
from worker.errors import LLMError


def _search(query: str, call_id: str = "c1") -> LLMReply:
    return call("search", {"query": query}, call_id=call_id)


def test_max_steps_ends_with_a_partial_answer_from_a_call_without_tools(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}), final("About 42."))
    run_id = harness.submit("What is 6 * 7 plus the moon's mass?", max_steps=1)
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.BEST_EFFORT]
    run = harness.run(run_id)
    assert run.status == RunStatus.MAX_STEPS and run.answer == "About 42." and run.partial
    assert "max_steps=1" in (run.error or "")
    assert harness.outcomes[-1][2].safeguard == "max_steps"
    # the last call keeps the tool schemas (the conversation names them) but may not call one
    last = harness.llm.options[-1]
    assert last["tool_choice"] == "none" and [t["function"]["name"] for t in last["tools"]]
    assert "tool_choice" not in harness.llm.options[0]
    assert "give your best Final Answer now" in harness.llm.requests[-1][-1]["content"]
    assert harness.llm.requests[-1][-1]["role"] == "user"
    steps = harness.steps(run_id)
    assert [s.best_effort for s in steps] == [False, True] and steps[1].final_answer == "About 42."
    view = run_json(run, steps)
    assert view["partial"] is True and view["trace"][1]["best_effort"] is True
    assert run.result_line()["partial"] is True
    assert run.usage.prompt_tokens == 20  # the last call's tokens are counted like any


def test_text_mode_asks_for_the_final_answer_and_reads_it(harness: Harness) -> None:
    harness.llm.script(
        LLMReply(content='Thought: compute\nAction: calculator\nAction Input: {"expression": "6*7"}',
                 usage=Usage(prompt_tokens=5, completion_tokens=5)),
        LLMReply(content="Thought: I have 42.\nFinal Answer: 42", usage=Usage(prompt_tokens=5, completion_tokens=5)),
    )
    run_id = harness.submit("What is 6 * 7?", max_steps=1, mode=Mode.TEXT)
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.BEST_EFFORT]
    run = harness.run(run_id)
    assert (run.status, run.answer, run.partial) == (RunStatus.MAX_STEPS, "42", True)
    assert "tool_choice" not in harness.llm.options[-1] and harness.llm.options[-1]["stop"]
    assert "Final Answer" in harness.llm.requests[-1][-1]["content"]


def test_a_redelivery_after_the_last_step_does_not_ask_again(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}), final("42"))
    run_id = harness.submit("What is 6 * 7?", max_steps=1)
    harness.drain()
    asked = len(harness.llm.requests)
    assert harness.deliver(run_id, 1).outcome == Outcome.FENCED  # the last step is recorded: fenced
    assert len(harness.llm.requests) == asked and len(harness.steps(run_id)) == 2


def test_switched_off_the_run_ends_at_the_limit_without_a_call(make_harness: Any) -> None:
    harness = make_harness(best_effort_answer=False)
    harness.llm.script(call("calculator", {"expression": "6*7"}))
    run_id = harness.submit("What is 6 * 7?", max_steps=1)
    assert harness.drain() == [Outcome.TOOL_CALLS]
    run = harness.run(run_id)
    assert run.status == RunStatus.MAX_STEPS and run.answer is None and not run.partial


def test_a_failed_last_call_leaves_the_answer_empty(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}), LLMError("down", 3))
    run_id = harness.submit("What is 6 * 7?", max_steps=1)
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.ENDED]
    run = harness.run(run_id)
    assert run.status == RunStatus.MAX_STEPS and run.answer is None and not run.partial


def test_no_last_call_past_the_run_token_budget(make_harness: Any) -> None:
    harness = make_harness(max_tokens_per_run=3000)
    harness.llm.script(call("calculator", {"expression": "6*7"}, tokens=5000))
    run_id = harness.submit("What is 6 * 7?", max_steps=1)
    harness.drain()
    run = harness.run(run_id)
    assert run.answer is None and not run.partial and len(harness.llm.requests) == 1


def test_no_last_call_past_the_deadline(make_harness: Any) -> None:
    harness = make_harness(run_deadline_s=0.001)
    harness.llm.script(call("calculator", {"expression": "6*7"}))
    run_id = harness.submit("What is 6 * 7?", max_steps=1)
    harness.drain()
    run = harness.run(run_id)
    assert run.answer is None and not run.partial and len(harness.llm.requests) == 1


def test_a_repeated_call_ends_with_a_best_effort_answer(harness: Harness) -> None:
    harness.llm.script(*[_search("moon mass", f"c{i}") for i in range(4)], final("I could not find it."))
    run_id = harness.submit("What is the moon's mass?")
    assert harness.drain()[-2:] == [Outcome.ENDED, Outcome.BEST_EFFORT]
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and "repeated the same action" in (run.error or "")
    assert run.answer == "I could not find it." and run.partial
    steps = harness.steps(run_id)
    assert steps[-2].limit == "loop" and steps[-1].best_effort
    assert "repeated the same action" in harness.llm.requests[-1][-1]["content"]
    assert harness.outcomes[-1][2].safeguard == "loop"


def test_invalid_outputs_end_with_a_best_effort_answer(harness: Harness) -> None:
    harness.llm.script(*[final("")] * 3, final("42, I think."))
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.INVALID_OUTPUT, Outcome.INVALID_OUTPUT, Outcome.ENDED, Outcome.BEST_EFFORT]
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and "invalid model outputs" in (run.error or "")
    assert run.answer == "42, I think." and run.partial
    assert harness.outcomes[-1][2].safeguard == "invalid_outputs"


def test_the_same_observation_again_and_again_is_hinted_then_stopped(harness: Harness) -> None:
    sums = ["2+2", "1+3", "3+1", "0+4"]  # different calls, the same observation every time
    harness.llm.script(*[call("calculator", {"expression": e}, call_id=f"c{i}") for i, e in enumerate(sums)],
                       final("Unknown."))
    run_id = harness.submit("Which sum is not 4?")
    assert harness.drain() == [Outcome.TOOL_CALLS] * 4 + [Outcome.BEST_EFFORT]
    steps = harness.steps(run_id)
    assert "returned the same observation" not in steps[1].observations[0].content
    assert "your last 3 steps returned the same observation" in steps[2].observations[0].content
    assert steps[3].limit == "no_progress"
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and "no progress" in (run.error or "")
    assert run.answer == "Unknown." and run.partial
    assert harness.outcomes[-1][2].safeguard == "no_progress"


def test_the_same_thought_again_and_again_is_hinted_then_stopped(harness: Harness) -> None:
    def turn(i: int) -> LLMReply:
        reply = call("calculator", {"expression": f"{i}+1"}, call_id=f"c{i}")
        return reply.model_copy(update={"content": "I am not sure what to do."})

    harness.llm.script(*[turn(i) for i in range(4)], final("2, roughly."))
    run_id = harness.submit("What is 1 + 1?")
    assert harness.drain() == [Outcome.TOOL_CALLS] * 3 + [Outcome.ENDED, Outcome.BEST_EFFORT]
    steps = harness.steps(run_id)
    assert "same thought 3 times" in steps[2].observations[-1].content
    assert "same thought" not in steps[1].observations[-1].content
    run = harness.run(run_id)
    assert run.status == RunStatus.FAILED and run.partial and harness.outcomes[-1][2].safeguard == "repeated_thought"


def test_a_repeated_call_gets_one_hint_not_two(harness: Harness) -> None:
    harness.llm.script(*[_search("moon mass", f"c{i}") for i in range(3)], final("7.3e22 kg"))
    run_id = harness.submit("What is the moon's mass?")
    harness.drain()
    third = harness.steps(run_id)[2].observations[0].content
    assert "same arguments 3 times" in third and "returned the same observation" not in third
