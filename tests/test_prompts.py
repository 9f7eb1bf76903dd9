"""Prompt building: message shapes in both modes, reflection, compaction to the context budget."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from worker.core.models import Mode, Observation, Step, ToolCall
from worker.core.prompts import (
    REFLECTION,
    TOOLS_SYSTEM,
    build_messages,
    estimate_tokens,
    step_messages,
    summarize_step,
)
from worker.tools.registry import Tool

SUMMARY_PREFIX = "Summary of earlier steps (compacted to fit the context window):\n"
BIG = 10**9  # a context budget nothing reaches


class ExprArgs(BaseModel):
    expression: str


class LookupArgs(BaseModel):
    query: str
    limit: int = 3


TOOLS = [
    Tool("calc", ExprArgs, "Evaluate arithmetic."),
    Tool("lookup", LookupArgs, "Find facts."),
]


def tool_step(index: int, *calls: tuple[str, dict | str, str], thought: str | None = "thinking") -> Step:
    """A step whose calls are (tool, arguments, observation content); call ids are c<index>-<n>."""
    return Step(
        index=index,
        thought=thought,
        tool_calls=[ToolCall(id=f"c{index}-{n}", name=t, arguments=a) for n, (t, a, _) in enumerate(calls)],
        observations=[
            Observation(call_id=f"c{index}-{n}", tool=t, content=o) for n, (t, _, o) in enumerate(calls)
        ],
    )


def error_step(index: int, raw: str | None = "blah", error: str = "Invalid format.\nUse Action:") -> Step:
    return Step(index=index, raw_output=raw, error=error)


def many_steps(n: int, obs_chars: int = 1500) -> list[Step]:
    return [
        tool_step(i, ("calc", {"expression": f"{i} * {i}"}, f"result {i * i} " + "z" * obs_chars))
        for i in range(n)
    ]


def build(mode: Mode, steps, budget: int = BIG, **kw):
    return build_messages(mode, "What is 6 * 7?", steps, TOOLS, context_budget_tokens=budget, **kw)


# --- message shapes ------------------------------------------------------------------------------


def test_tools_mode_head():
    messages, compacted = build(Mode.TOOLS, [])
    assert compacted == 0
    assert messages == [
        {"role": "system", "content": TOOLS_SYSTEM},
        {"role": "user", "content": "What is 6 * 7?"},
    ]


def test_text_mode_head_lists_the_tools():
    messages, _ = build(Mode.TEXT, [])
    system, question = messages
    assert system["role"] == "system"
    assert "calc(expression: str) - Evaluate arithmetic." in system["content"]
    assert "lookup(query: str, limit: int) - Find facts." in system["content"]
    assert "one of [calc, lookup]" in system["content"]
    assert "Final Answer:" in system["content"]
    assert question == {"role": "user", "content": "Question: What is 6 * 7?"}


def test_tools_mode_step_has_tool_calls_and_one_tool_message_per_observation_in_order():
    step = tool_step(
        0,
        ("calc", {"expression": "6 * 7"}, "42"),
        ("lookup", "raw string args", "a fact"),
        ("calc", {"expression": "1 + 1"}, "2"),
    )
    messages, _ = build(Mode.TOOLS, [step])
    assistant, *tool_messages = messages[2:]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "thinking"
    calls = assistant["tool_calls"]
    assert [c["id"] for c in calls] == ["c0-0", "c0-1", "c0-2"]
    assert all(c["type"] == "function" for c in calls)
    assert [c["function"]["name"] for c in calls] == ["calc", "lookup", "calc"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "6 * 7"}
    assert calls[1]["function"]["arguments"] == "raw string args"
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "c0-0", "content": "42"},
        {"role": "tool", "tool_call_id": "c0-1", "content": "a fact"},
        {"role": "tool", "tool_call_id": "c0-2", "content": "2"},
    ]


def test_tools_mode_arguments_keep_non_ascii():
    step = tool_step(0, ("lookup", {"query": "北京"}, "ok"))
    [assistant, _] = step_messages(Mode.TOOLS, step)
    assert "北京" in assistant["tool_calls"][0]["function"]["arguments"]


def test_tools_mode_step_without_thought_has_null_content():
    [assistant, _] = step_messages(Mode.TOOLS, tool_step(0, ("calc", {"expression": "1"}, "1"), thought=None))
    assert assistant["content"] is None


def test_text_mode_step():
    step = tool_step(0, ("calc", {"expression": "6 * 7"}, "42"), thought="I should compute.")
    messages, _ = build(Mode.TEXT, [step])
    assert messages[2:] == [
        {
            "role": "assistant",
            "content": 'Thought: I should compute.\nAction: calc\nAction Input: {"expression": "6 * 7"}',
        },
        {"role": "user", "content": "Observation: 42"},
    ]


def test_text_mode_step_with_string_input_and_no_thought():
    [assistant, _] = step_messages(Mode.TEXT, tool_step(0, ("lookup", "Paris", "x"), thought=None))
    assert assistant["content"] == "Thought: \nAction: lookup\nAction Input: Paris"


@pytest.mark.parametrize(
    ("mode", "feedback"),
    [(Mode.TEXT, "Observation: Invalid format.\nUse Action:"), (Mode.TOOLS, "Invalid format.\nUse Action:")],
)
def test_error_step_replays_the_output_and_the_error(mode, feedback):
    assert step_messages(mode, error_step(0)) == [
        {"role": "assistant", "content": "blah"},
        {"role": "user", "content": feedback},
    ]


def test_error_step_with_no_output_has_empty_content():
    [assistant, _] = step_messages(Mode.TOOLS, error_step(0, raw=None))
    assert assistant == {"role": "assistant", "content": ""}


def test_steps_follow_each_other_in_order():
    steps = [tool_step(0, ("calc", {"expression": "1"}, "1")), error_step(1), tool_step(2, ("calc", "2", "2"))]
    messages, compacted = build(Mode.TEXT, steps)
    assert compacted == 0
    expected = [m for s in steps for m in step_messages(Mode.TEXT, s)]
    assert messages[2:] == expected


# --- reflection ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_steps", "every", "reflects"),
    [(0, 2, False), (1, 2, False), (2, 2, True), (3, 2, False), (4, 2, True), (3, 3, True), (4, 0, False)],
)
def test_reflection_every_n_steps(n_steps, every, reflects):
    messages, _ = build(Mode.TOOLS, many_steps(n_steps, 5), reflect_every=every)
    has = messages[-1] == {"role": "user", "content": REFLECTION}
    assert has is reflects
    assert sum(m["content"] == REFLECTION for m in messages) == int(reflects)


# --- compaction ----------------------------------------------------------------------------------


def summary_lines(messages) -> list[str]:
    summary = messages[2]
    assert summary["role"] == "user"
    assert summary["content"].startswith(SUMMARY_PREFIX)
    return summary["content"][len(SUMMARY_PREFIX) :].split("\n")


@pytest.mark.parametrize("mode", list(Mode))
def test_under_budget_is_untouched(mode):
    steps = many_steps(6)
    full, _ = build(mode, steps)
    messages, compacted = build(mode, steps, budget=estimate_tokens(full))
    assert compacted == 0
    assert messages == full


@pytest.mark.parametrize("mode", list(Mode))
def test_over_budget_keeps_head_latest_steps_and_summarises_the_rest(mode):
    steps = many_steps(8)
    full, _ = build(mode, steps)
    budget = estimate_tokens(full) - 1
    messages, compacted = build(mode, steps, budget=budget, keep_recent_steps=3)
    assert compacted == 5
    assert messages[:2] == full[:2]
    lines = summary_lines(messages)
    assert len(lines) == 5
    for i, line in enumerate(lines):
        assert line.startswith(f"step {i + 1}: calc(")
        assert f"result {i * i}" in line
        assert len(line) <= 300
    assert messages[3:] == [m for s in steps[-3:] for m in step_messages(mode, s)]
    assert estimate_tokens(messages) <= budget


def test_tight_budget_keeps_fewer_recent_steps_but_never_drops_one():
    steps = many_steps(8)
    head = build(Mode.TOOLS, [])[0]
    older = steps[:-1]
    summary = {"role": "user", "content": SUMMARY_PREFIX + "\n".join(summarize_step(s, 300) for s in older)}
    expected = head + [summary] + step_messages(Mode.TOOLS, steps[-1])
    budget = estimate_tokens(expected)
    messages, compacted = build(Mode.TOOLS, steps, budget=budget, keep_recent_steps=3)
    assert messages == expected
    assert compacted == 7
    assert len(summary_lines(messages)) == 7


def test_infeasible_budget_returns_the_smallest_faithful_form():
    steps = many_steps(12)
    messages, compacted = build(Mode.TOOLS, steps, budget=10)
    assert compacted == 11
    lines = summary_lines(messages)
    assert [line.split(":")[0] for line in lines] == [f"step {i}" for i in range(1, 12)]
    assert all(len(line) <= 60 for line in lines)
    assert messages[3:] == step_messages(Mode.TOOLS, steps[-1])


def test_within_budget_whenever_the_smallest_form_fits():
    steps = many_steps(10, obs_chars=600)
    full, _ = build(Mode.TEXT, steps)
    smallest, _ = build(Mode.TEXT, steps, budget=1)
    floor, ceiling = estimate_tokens(smallest), estimate_tokens(full)
    assert floor < ceiling
    compacted_some = False
    for budget in range(floor, ceiling + 1, max(1, (ceiling - floor) // 40)):
        messages, compacted = build(Mode.TEXT, steps, budget=budget)
        size = estimate_tokens(messages)
        assert size <= budget
        # every step is there: verbatim or as a summary line
        verbatim = (len(messages) - 3) // 2 if compacted else len(steps)
        assert compacted + verbatim == len(steps)
        assert verbatim >= 1
        compacted_some = compacted_some or compacted > 0
    assert compacted_some


def test_single_step_is_never_compacted():
    steps = many_steps(1, obs_chars=50_000)
    messages, compacted = build(Mode.TOOLS, steps, budget=500)
    assert compacted == 0
    assert messages[2:] == step_messages(Mode.TOOLS, steps[0])


def test_compaction_keeps_error_steps_as_lines():
    steps = [error_step(0, error="No Action line found.\nmore detail"), *many_steps(5)[1:]]
    full, _ = build(Mode.TEXT, steps)
    messages, compacted = build(Mode.TEXT, steps, budget=estimate_tokens(full) - 1, keep_recent_steps=2)
    assert compacted == 3
    lines = summary_lines(messages)
    assert lines[0] == "step 1: invalid output (No Action line found.)"
    assert lines[1].startswith("step 2: calc(")


def test_compaction_keeps_the_reflection_prompt_last():
    steps = many_steps(6)
    full, _ = build(Mode.TOOLS, steps, reflect_every=3)
    messages, compacted = build(Mode.TOOLS, steps, budget=estimate_tokens(full) - 1, reflect_every=3)
    assert compacted > 0
    assert messages[-1] == {"role": "user", "content": REFLECTION}


def test_compacted_tools_conversation_has_no_orphan_tool_message():
    steps = [
        tool_step(i, ("calc", {"expression": str(i)}, "x" * 800), ("lookup", {"query": "q"}, "y" * 800))
        for i in range(6)
    ]
    messages, compacted = build(Mode.TOOLS, steps, budget=900)
    assert compacted > 0
    open_ids: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            open_ids = {c["id"] for c in m.get("tool_calls", [])}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in open_ids
            open_ids.discard(m["tool_call_id"])
    assert messages[-1]["role"] == "tool"


def test_summarize_step_joins_parallel_calls_and_flattens_whitespace():
    step = tool_step(3, ("calc", {"expression": "1+1"}, "2\n\n  done"), ("lookup", "Paris", "France"))
    assert summarize_step(step, 300) == 'step 4: calc({"expression": "1+1"}) -> 2 done; lookup(Paris) -> France'


def test_summarize_step_cuts_to_max_chars_with_a_marker():
    step = tool_step(0, ("calc", {"expression": "1"}, "w" * 500))
    line = summarize_step(step, 80)
    assert len(line) == 80
    assert line.endswith("…")
    assert line.startswith("step 1: calc(")


def test_summarize_step_with_an_empty_error():
    assert summarize_step(error_step(0, error=""), 100) == "step 1: invalid output ()"


# --- the estimate ------------------------------------------------------------------------------


def test_estimate_tokens_is_monotonic():
    assert estimate_tokens([]) == 0
    messages: list[dict] = []
    previous = 0
    for i in range(30):
        messages.append({"role": "user", "content": "word " * i})
        now = estimate_tokens(messages)
        assert now > previous
        previous = now
    short = estimate_tokens([{"role": "user", "content": "a" * 100}])
    long = estimate_tokens([{"role": "user", "content": "a" * 1000}])
    assert long > short
    assert 200 < long < 300  # about four characters a token
