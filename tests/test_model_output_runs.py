"""Model output as real small models write it, through the real StepRunner and RunStore (the in-process
harness on a real redis-server): a call written as text runs, reasoning reaches the trace, and replies cut
off at max_tokens end the run partial (the pure rules: tests/test_model_output.py)."""

from __future__ import annotations

from tests.harness import Harness, final
from worker.core.models import LLMReply, Mode, RunStatus, Usage
from worker.core.outcome import Outcome


def _reply(content: str, finish_reason: str = "stop", **kw: object) -> LLMReply:
    return LLMReply(content=content, finish_reason=finish_reason, usage=Usage(prompt_tokens=10, completion_tokens=5),
                    **kw)  # type: ignore[arg-type]


def test_a_call_written_as_text_runs_and_the_history_shows_it_as_a_call(harness: Harness) -> None:
    harness.llm.script(
        _reply('<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>',
               reasoning="6*7, the calculator does it"),
        final("42"),
    )
    run_id = harness.submit("What is 6 * 7?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    run = harness.run(run_id)
    assert (run.status, run.answer) == (RunStatus.SUCCEEDED, "42")
    steps = harness.steps(run_id)
    assert steps[0].tool_calls[0].name == "calculator" and steps[0].observations[0].content == "42"
    assert steps[0].reasoning == "6*7, the calculator does it"
    assistant = [m for m in harness.llm.requests[1] if m["role"] == "assistant"][0]
    assert assistant["tool_calls"][0]["function"]["name"] == "calculator"


def test_a_text_call_of_a_tool_not_offered_is_a_format_error(harness: Harness) -> None:
    harness.llm.script(_reply('{"name": "weather", "arguments": {"city": "Paris"}}'), final("I cannot tell."))
    run_id = harness.submit("Weather in Paris?")
    assert harness.drain() == [Outcome.INVALID_OUTPUT, Outcome.FINAL_ANSWER]
    step = harness.steps(run_id)[0]
    assert step.error and "'weather' is not one of the tools" in step.error and not step.tool_calls


def test_replies_cut_off_at_max_tokens_end_the_run_partial(harness: Harness) -> None:
    cut = _reply("<think>The question is long and I", "length")
    harness.llm.script(cut, _reply("Paris is the capital of", "length"), _reply("Paris is", "length"),
                       final("Paris."))
    run_id = harness.submit("What is the capital of France?", mode=Mode.TOOLS)
    assert harness.drain() == [Outcome.INVALID_OUTPUT, Outcome.INVALID_OUTPUT, Outcome.ENDED, Outcome.BEST_EFFORT]
    run = harness.run(run_id)
    assert (run.status, run.partial, run.answer) == (RunStatus.FAILED, True, "Paris.")
    assert (run.error or "").startswith("the model's reply was cut off at max_tokens")
    steps = harness.steps(run_id)
    assert steps[0].reasoning == "The question is long and I" and "cut off" in (steps[0].error or "")
    assert "cut off" in harness.llm.requests[1][-1]["content"]  # the model was told
    assert "cut off" in harness.llm.requests[-1][-1]["content"] and harness.outcomes[-1][2].safeguard == "cut_off"


def test_text_mode_cut_off_is_told_as_such(harness: Harness) -> None:
    harness.llm.script(_reply("Thought: I will look", "length"), _reply("Thought: ok\nFinal Answer: 4"))
    run_id = harness.submit("2+2?", mode=Mode.TEXT)
    assert harness.drain() == [Outcome.INVALID_OUTPUT, Outcome.FINAL_ANSWER]
    assert harness.llm.requests[1][-1]["content"].startswith("Observation: Invalid format: your reply was cut off")
    assert harness.run(run_id).answer == "4"
