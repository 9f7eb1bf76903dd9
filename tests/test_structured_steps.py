"""Structured answers through the real StepRunner and RunStore (the in-process harness on a real
redis-server, a scripted model): what each request offers and says, what each step records, and the
best-effort answer of a run whose answers never fit (the worker processes: tests/test_structured_runs.py)."""

from __future__ import annotations

import json

from tests.harness import Harness, call, final
from worker.core.models import Mode, RunStatus
from worker.core.outcome import Outcome

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_invalid_then_valid_records_the_refusal_and_then_the_object(harness: Harness) -> None:
    harness.llm.script(call("calculator", {"expression": "6*7"}), call("final_answer", {"n": "42"}, call_id="f1"),
                       call("final_answer", {"n": 42}, call_id="f2"))
    run_id = harness.submit("What is 6 * 7?", output_schema=SCHEMA)
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.INVALID_OUTPUT, Outcome.FINAL_ANSWER]
    run = harness.run(run_id)
    assert (run.status, run.output, json.loads(run.answer or "")) == (RunStatus.SUCCEEDED, {"n": 42}, {"n": 42})
    offered = [t["function"]["name"] for t in harness.llm.options[0]["tools"]]
    assert offered[-1] == "final_answer" and harness.llm.options[0]["tools"][-1]["function"]["parameters"] == SCHEMA
    assert "call the final_answer tool" in harness.llm.requests[0][0]["content"]  # the system prompt says so
    refused = harness.steps(run_id)[1]
    assert refused.raw_output == 'final_answer({"n": "42"})' and refused.output is None
    assert "at $.n: '42' is not of type 'integer'" in (refused.error or "")
    shown = harness.llm.requests[2][-2:]  # the model saw what it sent, then what is wrong with it
    assert shown[0]["content"] == 'final_answer({"n": "42"})' and "is not of type 'integer'" in shown[1]["content"]
    assert harness.steps(run_id)[2].output == {"n": 42}


def test_never_valid_ends_failed_and_its_best_effort_answer_is_kept_only_if_it_fits(harness: Harness) -> None:
    harness.llm.script(final("forty-two"), final("42"), final('{"n": "42"}'), final('{"n": 42}'))
    run_id = harness.submit("What is 6 * 7?", output_schema=SCHEMA, mode=Mode.TOOLS)
    assert harness.drain() == [Outcome.INVALID_OUTPUT, Outcome.INVALID_OUTPUT, Outcome.ENDED, Outcome.BEST_EFFORT]
    run = harness.run(run_id)
    assert (run.status, run.partial, run.output) == (RunStatus.FAILED, True, {"n": 42})
    assert (run.error or "").endswith("last validation error: at $.n: '42' is not of type 'integer'")
    assert harness.llm.options[-1]["tool_choice"] == "none"
    assert harness.llm.requests[-1][-1]["content"].endswith("the JSON object the output schema describes.")


def test_a_best_effort_answer_that_does_not_fit_leaves_no_output(harness: Harness) -> None:
    harness.llm.script(*[final("Thought: done\nFinal Answer: nope")] * 3, final("Final Answer: about forty"))
    run_id = harness.submit("What is 6 * 7?", output_schema=SCHEMA, mode=Mode.TEXT)
    harness.drain()
    run = harness.run(run_id)
    assert (run.status, run.partial, run.answer, run.output) == (RunStatus.FAILED, True, "about forty", None)
    assert "it is not JSON" in (run.error or "")
