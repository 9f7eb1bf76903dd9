"""Model output as real small models write it: tool calls written as text in tools
mode, reasoning (`reasoning_content`, `<think>`), replies cut at max_tokens, and format hints that give a
concrete example instead of placeholders a model could echo back. Pure: the parser and the engine, with
a small registry of our own tools."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.test_engine import ExprArgs, _echo, registry
from worker.cli.display import print_trace
from worker.core import best_effort
from worker.core.best_effort import answer_from
from worker.core.engine import (
    ENGINE_ERROR_KINDS,
    Act,
    End,
    Final,
    Limits,
    Retry,
    decide,
    parse_reply,
    reply_reasoning,
)
from worker.core.models import LLMReply, Mode, Run, RunSpec, RunStatus, Step, ToolCall, Usage
from worker.core.parser import (
    PARSE_ERROR_KINDS,
    PARSE_WARNINGS,
    parse_text,
    parse_tool_reply,
    split_reasoning,
    text_tool_calls,
)
from worker.core.prompts import format_example
from worker.core.views import run_json
from worker.llm.client import parse_completion
from worker.metrics import SAFEGUARD_KINDS
from worker.store.runs import advance
from worker.tools.registry import Tool, ToolRegistry


@pytest.fixture
def tools() -> ToolRegistry:
    return registry()  # calc, lookup, add, python


def run_(mode: Mode = Mode.TOOLS, **kw) -> Run:
    return Run(spec=RunSpec(question="q"), mode=mode, **kw)


def reply(content: str | None, finish_reason: str | None = "stop", **kw) -> LLMReply:
    return LLMReply(content=content, finish_reason=finish_reason, **kw)


CALC = {"name": "calc", "arguments": {"expression": "2+2"}}
LOOKUP = {"name": "lookup", "arguments": {"query": "x"}}


def j(value) -> str:
    return json.dumps(value)


# --- 1. tool calls written as text -----------------------------------------------------------------------

WRITTEN_CALLS = [
    pytest.param(j(CALC), None, [CALC], id="bare-json"),
    pytest.param("  \n" + j(CALC) + "\n", None, [CALC], id="bare-json-with-blank-lines"),
    pytest.param(j({"name": "calc", "parameters": {"expression": "2+2"}}), None, [CALC], id="parameters"),
    pytest.param(j({"name": "calc", "arguments": j({"expression": "2+2"})}), None, [CALC], id="string-arguments"),
    pytest.param(j({"type": "function", "function": CALC}), None, [CALC], id="openai-shape"),
    pytest.param(j([CALC, LOOKUP]), None, [CALC, LOOKUP], id="bare-list"),
    pytest.param("```json\n" + j(CALC) + "\n```", None, [CALC], id="fenced"),
    pytest.param("```\n" + j(CALC) + "\n```", None, [CALC], id="fenced-no-language"),
    pytest.param("I will compute it.\n```json\n" + j(CALC) + "\n```", "I will compute it.", [CALC],
                 id="prose-then-fence"),
    pytest.param("Thought: compute it\n" + j(CALC), "compute it", [CALC], id="thought-label-then-json"),
    pytest.param("<tool_call>\n" + j(CALC) + "\n</tool_call>", None, [CALC], id="tool-call-tag"),
    pytest.param("<tool_call>\n" + j(CALC) + "\n</tool_call>\n<tool_call>\n" + j(LOOKUP) + "\n</tool_call>",
                 None, [CALC, LOOKUP], id="two-tool-call-tags"),
    pytest.param("<tool_call>" + j(CALC), None, [CALC], id="unclosed-tag"),
    pytest.param("<tools>\n" + j([CALC, LOOKUP]) + "\n</tools>", None, [CALC, LOOKUP], id="tools-tag-list"),
    pytest.param("<tools>\n" + j(CALC) + "\n" + j(LOOKUP) + "\n</tools>", None, [CALC, LOOKUP],
                 id="tools-tag-two-objects"),
    pytest.param("<tool_call>\n```json\n" + j(CALC) + "\n```\n</tool_call>", None, [CALC], id="fence-in-tag"),
    pytest.param("<|python_tag|>" + j({"name": "calc", "parameters": {"expression": "2+2"}}), None, [CALC],
                 id="llama-python-tag"),
    pytest.param("<|python_tag|>" + j(CALC) + "<|eom_id|>", None, [CALC], id="llama-python-tag-eom"),
    pytest.param("[TOOL_CALLS]" + j([CALC]), None, [CALC], id="mistral"),
    pytest.param("[TOOL_CALLS] " + j([CALC, LOOKUP]), None, [CALC, LOOKUP], id="mistral-two"),
    pytest.param("Let me look.\n<tool_call>" + j(LOOKUP) + "</tool_call>", "Let me look.", [LOOKUP],
                 id="prose-then-tag"),
    pytest.param("I'll search. <tool_call>" + j(LOOKUP) + "</tool_call>", "I'll search.", [LOOKUP],
                 id="tag-inline-after-prose"),
    pytest.param(j({"name": "calc"}).replace("}", ', "arguments": null}'), None,
                 [{"name": "calc", "arguments": {}}], id="null-arguments"),
    pytest.param("<tool_call>" + j({"name": "calc"}) + "</tool_call>", None, [{"name": "calc", "arguments": {}}],
                 id="tag-without-arguments"),
]


def _calls(turn) -> list[dict]:
    return [{"name": c.name, "arguments": c.arguments} for c in turn.calls]


@pytest.mark.parametrize(("content", "thought", "calls"), WRITTEN_CALLS)
def test_tools_mode_reads_a_call_written_as_text(content, thought, calls):
    turn = parse_tool_reply(content, [])
    assert turn.error is None and turn.final_answer is None
    assert _calls(turn) == calls
    assert turn.thought == thought
    assert [c.id for c in turn.calls] == [f"text-{i}" for i in range(len(calls))]
    assert "text_tool_call" in turn.warnings


@pytest.mark.parametrize(("content", "thought", "calls"), WRITTEN_CALLS)
def test_text_mode_reads_the_first_call_written_as_text(content, thought, calls):
    turn = parse_text(content)
    assert turn.error is None and turn.final_answer is None
    assert _calls(turn) == calls[:1] and turn.calls[0].id == "text-0"
    assert ("multiple_actions" in turn.warnings) == (len(calls) > 1)


@pytest.mark.parametrize("content", [
    j(CALC) + "\nI will wait for the result.",
    "```json\n" + j(CALC) + "\n```\nThen I will answer.",
    "<tool_call>" + j(CALC) + "</tool_call>\nThen I will answer.",
])  # fmt: skip
def test_text_after_a_leading_call_is_dropped(content):
    turn = parse_tool_reply(content, [])
    assert _calls(turn) == [CALC]
    assert "trailing_text" in turn.warnings


@pytest.mark.parametrize("content", [
    'The API answers {"name": "calc", "arguments": {}} when it is called.',
    'Send this:\n{"name": "calc", "arguments": {"expression": "1"}}\nand the server computes it.',
    "The answer is 4.",
    j({"name": "Ada Lovelace", "born": 1815}),
    j({"arguments": {"x": 1}}),
    j({"name": "", "arguments": {}}),
    j([]),
    j([CALC, {"name": "calc"}]),  # not every element a call (bare JSON needs the arguments)
    j(["calc", "lookup"]),
    "```python\nprint(1)\n```",
    "{not json at all}",
    "Use the format {\"name\": ..., \"arguments\": ...} to call a tool.",
])  # fmt: skip
def test_prose_that_mentions_json_stays_an_answer(content):
    turn = parse_tool_reply(content, [])
    assert turn.final_answer == content.strip() and not turn.calls and turn.error is None
    assert text_tool_calls(content) is None


@pytest.mark.parametrize("content", [
    "<tool_call>calc(2+2)</tool_call>",
    "<tool_call></tool_call>",
    "<tool_call>" + j({"arguments": {}}) + "</tool_call>",
    "<tool_call>" + j(["calc"]) + "</tool_call>",
    "<|python_tag|>calc.call(expression=\"2+2\")",
    "[TOOL_CALLS] [{\"name\": \"calc\", ",
    "<tools>" + j(CALC) + " trailing words</tools>",
    "<tool_call>" + j(CALC) + "</tool_call><tool_call>oops</tool_call>",
])  # fmt: skip
def test_call_tags_around_something_unreadable_are_a_format_error(content):
    for turn in (parse_tool_reply(content, []), parse_text(content)):
        assert turn.error_kind == "invalid_text_call" and turn.error
        assert not turn.calls and turn.final_answer is None
        assert "<tool>" not in turn.error  # no placeholder a model could copy back


def test_tools_mode_final_answer_label_before_tags_is_the_answer():
    turn = parse_tool_reply("Final Answer: models write <tool_call> tags", [])
    assert turn.final_answer == "models write <tool_call> tags"


def test_native_tool_calls_win_over_a_call_written_in_the_content():
    native = ToolCall(id="n1", name="lookup", arguments='{"query": "y"}')
    turn = parse_tool_reply("<tool_call>" + j(CALC) + "</tool_call>", [native])
    assert _calls(turn) == [{"name": "lookup", "arguments": {"query": "y"}}]
    assert "text_tool_call" not in turn.warnings


def test_text_mode_labels_win_over_json():
    turn = parse_text('Thought: t\nAction: lookup\nAction Input: {"query": "x"}')
    assert _calls(turn) == [LOOKUP] and "text_tool_call" not in turn.warnings


def test_many_json_lines_stay_linear():
    content = "\n".join(["{"] * 20_000 + [j(CALC)])
    assert text_tool_calls(content) is None  # only the first few candidates are tried
    assert text_tool_calls("<tools>" + "{" * 50_000 + "</tools>").error_kind == "invalid_text_call"


def test_new_labels_are_declared():
    assert "invalid_text_call" in PARSE_ERROR_KINDS and "text_tool_call" in PARSE_WARNINGS
    assert "text_call_rejected" in ENGINE_ERROR_KINDS


def test_a_written_call_of_an_offered_tool_with_valid_arguments_runs(tools):
    turn = parse_reply(Mode.TOOLS, reply("<tool_call>" + j(CALC) + "</tool_call>"))
    decision = decide(run_(), [], turn, tools, Limits())
    assert isinstance(decision, Act) and not decision.rejected
    assert [(p.tool, p.arguments) for p in decision.planned] == [("calc", {"expression": "2+2"})]


def test_a_written_call_by_an_alias_or_other_case_runs(tools):
    reg = ToolRegistry()
    reg.register(Tool("calc", ExprArgs, "arithmetic", _echo, idempotent=True, aliases=("calculator",)))
    turn = parse_reply(Mode.TOOLS, reply(j({"name": "Calculator", "arguments": {"expression": "1"}})))
    decision = decide(run_(), [], turn, reg, Limits())
    assert isinstance(decision, Act) and decision.planned[0].tool == "calc"


@pytest.mark.parametrize(("content", "says"), [
    (j({"name": "weather", "arguments": {"city": "Paris"}}), "'weather' is not one of the tools"),
    (j({"name": "calc", "arguments": {"expr": "1"}}), "invalid arguments for calc: expression"),
    (j({"name": "calc", "arguments": "{broken"}), "invalid arguments for calc"),
    (j({"name": "lookup", "arguments": {"query": "x", "limit": "many"}}), "invalid arguments for lookup: limit"),
    (j([CALC, {"name": "nope", "arguments": {}}]), "'nope' is not one of the tools"),
])  # fmt: skip
def test_a_written_call_that_is_not_a_valid_call_is_a_format_error(tools, content, says):
    for mode in Mode if content.startswith("{") else [Mode.TOOLS]:  # text mode runs only a list's first call
        turn = parse_reply(mode, reply(content))
        decision = decide(run_(mode), [], turn, tools, Limits())
        assert isinstance(decision, Retry), (mode, decision)
        assert decision.kind == "text_call_rejected"
        assert says in decision.error and "add, calc, lookup, python" in decision.error


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("name", ["<tool name>", "<tool>", "<calc>", "< lookup >"])
def test_a_placeholder_tool_name_is_a_format_error_not_a_call(tools, mode, name):
    content = (j({"name": name, "arguments": {"expression": "1"}}) if mode == Mode.TOOLS
               else f'Thought: t\nAction: {name}\nAction Input: {{"expression": "1"}}')
    native = reply(None, tool_calls=[ToolCall(id="a", name=name, arguments='{"expression": "1"}')])
    for r in (reply(content), native) if mode == Mode.TOOLS else (reply(content),):
        turn = parse_reply(mode, r)
        decision = decide(run_(mode), [], turn, tools, Limits())
        assert isinstance(decision, Retry) and decision.kind == "placeholder", decision
        assert "is a placeholder, not a tool name" in decision.error and "add, calc, lookup, python" in decision.error


def test_an_offered_tool_named_in_angle_brackets_runs():
    reg = ToolRegistry()
    reg.register(Tool("<calc>", ExprArgs, "odd but offered", _echo, idempotent=True))
    turn = parse_reply(Mode.TEXT, reply('Action: <calc>\nAction Input: {"expression": "1"}'))
    assert isinstance(decide(run_(Mode.TEXT), [], turn, reg, Limits()), Act)


def test_echoed_hint_placeholders_in_text_mode_are_format_errors(tools):
    example = format_example(registry().all())
    for content in ("Thought: t\nAction: <tool name>\nAction Input: <JSON arguments>",
                    "Thought: t\nAction: calc\nAction Input: <JSON arguments>",
                    "Thought: t\nFinal Answer: <answer>"):
        turn = parse_reply(Mode.TEXT, reply(content), example)
        assert turn.error_kind == "placeholder" and "placeholder" in turn.error
        assert "<tool name>" not in turn.error.split("placeholder", 1)[1]  # the hint after it shows a real call
        decision = decide(run_(Mode.TEXT), [], turn, tools, Limits())
        assert isinstance(decision, Retry) and decision.kind == "placeholder"


def test_format_errors_show_a_call_of_the_first_offered_tool(tools):
    example = format_example(registry().all())
    assert example is not None and example.tool == "add"
    for mode, content in ((Mode.TEXT, "blah"), (Mode.TOOLS, "<tool_call>oops</tool_call>")):
        error = parse_reply(mode, reply(content), example).error
        assert "add" in error and '{"a": 3, "b": 3}' in error


def test_rejected_written_calls_count_towards_the_invalid_output_limit(tools):
    turn = parse_reply(Mode.TOOLS, reply(j({"name": "nope", "arguments": {}})))
    decision = decide(run_(invalid_streak=2), [], turn, tools, Limits())
    assert isinstance(decision, End) and decision.status == RunStatus.FAILED
    assert decision.safeguard == "invalid_outputs" and "'nope' is not one of the tools" in decision.reason


def test_a_native_call_of_an_unknown_tool_is_still_an_observation(tools):
    turn = parse_reply(Mode.TOOLS, reply(None, tool_calls=[ToolCall(id="a", name="nope", arguments="{}")]))
    decision = decide(run_(), [], turn, tools, Limits())
    assert isinstance(decision, Act) and decision.rejected[0].outcome == "unknown_tool"


# --- 2. reasoning models -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "reasoning", "rest"), [
    ("<think>a\nb</think>\nFinal Answer: 4", "a\nb", "Final Answer: 4"),
    ("<think>\n\n</think>\n\n4", None, "4"),  # Qwen3 with thinking off: an empty block
    ("<THINKING>x</THINKING> y", "x", "y"),
    ("<think>cut at max_tokens, never closed", "cut at max_tokens, never closed", None),
    ("the template opened it</think>\n\n4", "the template opened it", "4"),
    ("a</think>b<think>c</think>d", "a\n\nc", "b\nd"),
    ("I think so.", None, "I think so."),
    ("<b>no</b> thinking here", None, "<b>no</b> thinking here"),
    (None, None, None),
])  # fmt: skip
def test_split_reasoning(content, reasoning, rest):
    assert split_reasoning(content) == (reasoning, rest)


def test_split_reasoning_stays_linear():
    split_reasoning("<think>" * 20_000)
    split_reasoning("</think>" * 20_000 + "x")


def _completion(message: dict, usage: dict | None = None) -> str:
    return json.dumps({"model": "m", "choices": [{"message": {"role": "assistant", **message},
                                                  "finish_reason": "stop"}],
                       "usage": usage or {"prompt_tokens": 7, "completion_tokens": 30}})


@pytest.mark.parametrize(("message", "content", "reasoning"), [
    ({"content": "4", "reasoning_content": "2+2 is 4"}, "4", "2+2 is 4"),
    ({"content": "4", "reasoning": "2+2 is 4"}, "4", "2+2 is 4"),
    ({"content": "<think>2+2 is 4</think>\n4"}, "4", "2+2 is 4"),
    ({"content": "<think>more</think>4", "reasoning_content": "first"}, "4", "first\n\nmore"),
    ({"content": "<think>cut", "reasoning_content": None}, None, "cut"),
    ({"content": "4"}, "4", None),
])  # fmt: skip
def test_the_llm_edge_keeps_reasoning_out_of_the_content(message, content, reasoning):
    got = parse_completion(_completion(message))
    assert (got.content, got.reasoning) == (content, reasoning)
    assert got.usage == Usage(prompt_tokens=7, completion_tokens=30)  # reasoning tokens are in completion_tokens


def test_the_llm_edge_keeps_the_reported_reasoning_tokens():
    usage = {"prompt_tokens": 7, "completion_tokens": 30, "completion_tokens_details": {"reasoning_tokens": 25}}
    got = parse_completion(_completion({"content": "4", "reasoning_content": "..."}, usage))
    assert got.reasoning_tokens == 25 and got.usage.completion_tokens == 30
    assert parse_completion(_completion({"content": "4"})).reasoning_tokens is None
    odd = {"prompt_tokens": 1, "completion_tokens": 2, "completion_tokens_details": None}
    assert parse_completion(_completion({"content": "4"}, odd)).reasoning_tokens is None


@pytest.mark.parametrize("mode", list(Mode))
def test_reasoning_is_kept_out_of_the_answer_and_the_parser(mode, tools):
    answer = "Final Answer: 4" if mode == Mode.TEXT else "4"
    content = "<think>Final Answer: 5? No. Action: calc</think>\n" + answer
    for r in (reply(content), reply(answer, reasoning="Final Answer: 5? No. Action: calc")):
        turn = parse_reply(mode, r)
        assert turn.final_answer == "4" and not turn.calls
        assert turn.reasoning == "Final Answer: 5? No. Action: calc"
        assert decide(run_(mode), [], turn, tools, Limits()) == Final("4")


def test_reasoning_beside_a_call_is_not_the_thought(tools):
    r = reply("<think>need calc</think>", tool_calls=[ToolCall(id="a", name="calc", arguments='{"expression": "1"}')])
    turn = parse_reply(Mode.TOOLS, r)
    assert turn.thought is None and turn.reasoning == "need calc" and turn.calls[0].name == "calc"


def test_only_reasoning_and_no_reply_is_an_empty_reply():
    turn = parse_reply(Mode.TOOLS, reply("<think>hmm</think>"))
    assert turn.error_kind == "empty" and turn.reasoning == "hmm"


def test_the_best_effort_answer_leaves_the_reasoning_out():
    assert answer_from(Mode.TOOLS, reply("<think>so 4</think>\n4")) == "4"
    assert answer_from(Mode.TEXT, reply("<think>so 4</think>\nFinal Answer: 4")) == "4"
    assert answer_from(Mode.TOOLS, reply(j(CALC))) is None  # a call written as text is no answer
    assert reply_reasoning(reply("<think>b</think>4", reasoning="a")) == "a\n\nb"


def test_the_trace_shows_the_reasoning():
    run = run_(status=RunStatus.SUCCEEDED, answer="4")
    step = Step(index=0, reasoning="2+2 is 4", reasoning_tokens=12, final_answer="4")
    console = Console(record=True, width=200)
    print_trace(console, run, [step])
    text = console.export_text()
    assert "reasoning (12 tokens): 2+2 is 4" in text
    assert run_json(run, [step])["trace"][0]["reasoning"] == "2+2 is 4"


# --- 3. replies cut off at max_tokens ----------------------------------------------------------------------

CUT = [
    pytest.param(Mode.TOOLS, "The capital of France is", id="tools-prose"),
    pytest.param(Mode.TOOLS, "Final Answer: The capital of France is", id="tools-final-label"),
    pytest.param(Mode.TOOLS, "<think>Let me think about this very long", id="tools-cut-in-reasoning"),
    pytest.param(Mode.TOOLS, '<tool_call>{"name": "calc", "argum', id="tools-written-call-cut"),
    pytest.param(Mode.TEXT, "Thought: I know it\nFinal Answer: The capital of France is", id="text-final"),
    pytest.param(Mode.TEXT, "Thought: I should look it up and then I should", id="text-thought-only"),
    pytest.param(Mode.TEXT, "Thought: t\nAction: lookup\nAction Input: capital of Fr", id="text-plain-input"),
    pytest.param(Mode.TEXT, 'Thought: t\nAction: lookup\nAction Input: {"query": "capital of Fr', id="text-json-cut"),
    pytest.param(Mode.TEXT, "", id="text-empty"),
]


@pytest.mark.parametrize(("mode", "content"), CUT)
def test_a_reply_cut_at_max_tokens_is_never_an_answer(mode, content, tools):
    turn = parse_reply(mode, reply(content, "length"))
    assert turn.error_kind == "truncated" and not turn.calls and turn.final_answer is None
    assert "cut off" in turn.error and "max_tokens" in turn.error and "shorter" in turn.error
    decision = decide(run_(mode), [], turn, tools, Limits())
    assert isinstance(decision, Retry) and decision.kind == "truncated"


def test_a_cut_off_tool_reply_with_broken_native_arguments_is_a_format_error(tools):
    cut = [ToolCall(id="a", name="calc", arguments='{"expression": "2+')]
    turn = parse_reply(Mode.TOOLS, reply(None, "length", tool_calls=cut))
    assert turn.error_kind == "truncated" and not turn.calls


@pytest.mark.parametrize(("mode", "r"), [
    (Mode.TOOLS, reply(None, "length", tool_calls=[ToolCall(id="a", name="calc", arguments='{"expression": "1"}')])),
    (Mode.TOOLS, reply("<think>long</think>" + j(CALC), "length")),
    (Mode.TEXT, reply('Thought: t\nAction: calc\nAction Input: {"expression": "1"}', "length")),
])  # fmt: skip
def test_complete_calls_in_a_cut_off_reply_still_run(mode, r, tools):
    turn = parse_reply(mode, r)
    assert turn.error is None and turn.calls[0].name == "calc"
    assert isinstance(decide(run_(mode), [], turn, tools, Limits()), Act)


@pytest.mark.parametrize("finish_reason", ["stop", None, "tool_calls", "content_filter"])
def test_other_finish_reasons_leave_the_answer_alone(finish_reason):
    assert parse_reply(Mode.TOOLS, reply("Paris", finish_reason)).final_answer == "Paris"


def test_cut_off_replies_use_the_format_error_budget_and_end_with_their_own_reason(tools):
    turn = parse_reply(Mode.TOOLS, reply("The capital", "length"))
    assert isinstance(decide(run_(invalid_streak=1), [], turn, tools, Limits()), Retry)
    end = decide(run_(invalid_streak=2), [], turn, tools, Limits())
    assert isinstance(end, End) and end.status == RunStatus.FAILED and end.safeguard == "cut_off"
    assert end.reason.startswith("the model's reply was cut off at max_tokens")
    assert best_effort.eligible(end)  # a best-effort answer follows: the run ends with partial=true
    assert "cut off" in best_effort.instruction(end) and "short" in best_effort.instruction(end)
    other = decide(run_(invalid_streak=2), [], parse_reply(Mode.TOOLS, reply("")), tools, Limits())
    assert isinstance(other, End) and other.safeguard == "invalid_outputs"  # the last one was not cut off


def test_a_run_ended_by_cut_off_replies_is_partial_with_its_best_effort_answer():
    run = run_(status=RunStatus.RUNNING, current_step=3)
    end = End(RunStatus.FAILED, "the model's reply was cut off at max_tokens (3 invalid model outputs in a row, "
              "the last one cut off)", "cut_off")
    step = Step(index=3, best_effort=True, final_answer="Paris")
    advance(run, step, lambda r: end, invalid=False)
    assert (run.status, run.partial, run.answer) == (RunStatus.FAILED, True, "Paris")
    assert run.error.startswith("the model's reply was cut off at max_tokens")


def test_cut_off_is_a_declared_safeguard():
    assert "cut_off" in SAFEGUARD_KINDS and "cut_off" in best_effort.LOOP_SAFEGUARDS
    assert "truncated" in ENGINE_ERROR_KINDS


# --- properties over random input


_PIECES = ["<tool_call>", "</tool_call>", "<tools>", "</tools>", "<|python_tag|>", "<|eom_id|>", "[TOOL_CALLS]",
           "<think>", "</think>", "```json\n", "```", "\n", " ", "{", "}", "[", "]", ",", ":", '"name"', '"calc"',
           '"arguments"', '"parameters"', '"expression"', '"1"', "null", "Final Answer:", "Thought:", "Action:",
           "Action Input:", "<tool name>", "<JSON arguments>", j(CALC), j([CALC, LOOKUP]), "x", "é", "\\"]


def test_fuzz_never_raises_and_keeps_one_outcome(tools):
    import random

    rng = random.Random(30)
    for _ in range(3000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 30)))
        for mode in Mode:
            r = reply(text, rng.choice(["stop", "length", None]), reasoning=rng.choice([None, "r"]))
            turn = parse_reply(mode, r, format_example(registry().all()))
            outcomes = [bool(turn.calls), turn.final_answer is not None, turn.error is not None]
            assert sum(outcomes) == 1, (text, turn)
            assert turn.error_kind is None or turn.error_kind in (*PARSE_ERROR_KINDS, *ENGINE_ERROR_KINDS)
            assert mode == Mode.TOOLS or len(turn.calls) <= 1
            assert "<think>" not in (turn.final_answer or "") and "</think>" not in (turn.final_answer or "")
            decide(run_(mode), [], turn, tools, Limits())  # never raises either
