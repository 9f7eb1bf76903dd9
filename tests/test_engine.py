"""The pure step decision (`decide`); its limits, truncation, call ids and pricing: tests/test_engine_limits.py.

The tools here are our own (a small ToolRegistry with pydantic argument models): no network, no
built-in tool behaviour, so only the engine's rules are under test.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from worker.core.engine import (
    Act,
    End,
    Final,
    Limits,
    PlannedCall,
    Retry,
    call_signature,
    decide,
)
from worker.core.models import Run, RunSpec, RunStatus, Step, ToolCall
from worker.core.parser import ParsedTurn, parse_text, parse_tool_reply
from worker.tools.registry import Tool, ToolRegistry


class ExprArgs(BaseModel):
    expression: str


class LookupArgs(BaseModel):
    query: str
    limit: int = 3


class AddArgs(BaseModel):
    a: int
    b: int


class CodeArgs(BaseModel):
    code: str


def _echo(args: BaseModel) -> str:
    return repr(args)


@pytest.fixture
def tools() -> ToolRegistry:
    return registry()


def registry() -> ToolRegistry:
    """calc, lookup, add, python (tests/test_model_output.py uses them too)."""
    reg = ToolRegistry()
    reg.register(Tool("calc", ExprArgs, "arithmetic", _echo, idempotent=True))
    reg.register(Tool("lookup", LookupArgs, "find things", _echo, idempotent=True))
    reg.register(Tool("add", AddArgs, "add two integers", _echo))
    reg.register(Tool("python", CodeArgs, "run code", None, sandboxed=True))
    return reg


LIMITS = Limits()


def run_(**kw) -> Run:
    return Run(spec=RunSpec(question="q"), **kw)


def call(name: str, arguments: dict | str, call_id: str = "c1") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def acting(*calls: ToolCall) -> ParsedTurn:
    return ParsedTurn(thought="t", calls=list(calls))


def history_with(*calls: ToolCall) -> list[Step]:
    """One earlier step per call."""
    return [Step(index=i, tool_calls=[c]) for i, c in enumerate(calls)]


# --- final answers and unusable outputs --------------------------------------------------------


def test_final_answer_is_stripped(tools):
    decision = decide(run_(), [], ParsedTurn(final_answer="  42 \n"), tools, LIMITS)
    assert decision == Final("42")


def test_final_answer_from_a_real_text_reply(tools):
    turn = parse_text("Thought: I know it.\nFinal Answer: Paris")
    assert decide(run_(), [], turn, tools, LIMITS) == Final("Paris")


def test_format_error_becomes_retry_with_error_text_and_kind(tools):
    turn = ParsedTurn(error="Your reply had no Action line.", error_kind="no_action")
    decision = decide(run_(), [], turn, tools, LIMITS)
    assert decision == Retry("Your reply had no Action line.", "no_action")


def test_garbage_from_the_parser_is_a_retry_of_kind_garbage(tools):
    turn = parse_text("I am just chatting, no labels at all.")
    decision = decide(run_(), [], turn, tools, LIMITS)
    assert isinstance(decision, Retry)
    assert decision.kind == "garbage"
    assert decision.error == turn.error and decision.error


def test_empty_tools_mode_reply_is_a_retry_of_kind_empty(tools):
    decision = decide(run_(), [], parse_tool_reply(None, []), tools, LIMITS)
    assert isinstance(decision, Retry)
    assert decision.kind == "empty"


def test_turn_with_nothing_in_it_is_a_retry_with_a_default_message(tools):
    decision = decide(run_(), [], ParsedTurn(), tools, LIMITS)
    assert isinstance(decision, Retry)
    assert decision.kind == "empty"
    assert "no tool call and no final answer" in decision.error


@pytest.mark.parametrize("streak", [0, 1])
def test_invalid_outputs_below_the_limit_retry(tools, streak):
    turn = ParsedTurn(error="bad format", error_kind="garbage")
    assert isinstance(decide(run_(invalid_streak=streak), [], turn, tools, LIMITS), Retry)


def test_third_invalid_output_in_a_row_fails_the_run_naming_the_count(tools):
    turn = ParsedTurn(error="bad format: no Action", error_kind="no_action")
    decision = decide(run_(invalid_streak=2), [], turn, tools, LIMITS)
    assert isinstance(decision, End)
    assert decision.status == RunStatus.FAILED
    assert "3 invalid model outputs in a row" in decision.reason
    assert "bad format: no Action" in decision.reason


def test_invalid_output_limit_is_configurable(tools):
    turn = ParsedTurn(error="bad", error_kind="garbage")
    decision = decide(run_(), [], turn, tools, Limits(max_invalid_outputs=1))
    assert isinstance(decision, End) and decision.reason.startswith("1 invalid")
    assert isinstance(decide(run_(invalid_streak=3), [], turn, tools, Limits(max_invalid_outputs=5)), Retry)


def test_a_valid_turn_after_invalid_ones_is_not_punished(tools):
    decision = decide(run_(invalid_streak=2), [], acting(call("calc", {"expression": "1"})), tools, LIMITS)
    assert isinstance(decision, Act) and len(decision.planned) == 1


# --- unknown tools and arguments ---------------------------------------------------------------


def test_unknown_tool_is_rejected_with_the_available_tools(tools):
    decision = decide(run_(), [], acting(call("wikipedia", {"q": "x"}, "w1")), tools, LIMITS)
    assert isinstance(decision, Act)
    assert decision.planned == []
    [obs] = decision.rejected
    assert obs.call_id == "w1"
    assert obs.tool == "wikipedia"
    assert obs.outcome == "unknown_tool"
    assert "'wikipedia'" in obs.content
    assert "Available tools: add, calc, lookup, python." in obs.content


def test_tool_lookup_ignores_case_and_spaces(tools):
    decision = decide(run_(), [], acting(call(" CALC ", {"expression": "2"})), tools, LIMITS)
    assert isinstance(decision, Act)
    [planned] = decision.planned
    assert planned.tool == "calc"
    assert planned.arguments == {"expression": "2"}


def _rejected(decision) -> str:
    assert isinstance(decision, Act)
    assert decision.planned == []
    [obs] = decision.rejected
    assert obs.outcome == "invalid_arguments"
    assert obs.content.startswith("Error: ")
    return obs.content


def test_missing_field_is_reported(tools):
    content = _rejected(decide(run_(), [], acting(call("calc", {})), tools, LIMITS))
    assert "invalid arguments for calc" in content
    assert "expression: Field required" in content
    assert '{"expression": "2 + 3 * 4"}' in content  # a plausible value, never a placeholder


def test_wrong_type_is_reported_with_the_field(tools):
    content = _rejected(decide(run_(), [], acting(call("add", {"a": "seven", "b": 2})), tools, LIMITS))
    assert "a: Input should be a valid integer" in content
    assert "b:" not in content


def test_wrong_type_for_a_string_field(tools):
    content = _rejected(decide(run_(), [], acting(call("calc", {"expression": 5})), tools, LIMITS))
    assert "expression: Input should be a valid string" in content


def test_validated_arguments_are_what_gets_planned(tools):
    decision = decide(run_(), [], acting(call("add", {"a": "5", "b": 2, "extra": 1})), tools, LIMITS)
    assert isinstance(decision, Act)
    assert decision.planned[0].arguments == {"a": 5, "b": 2}


def test_string_is_coerced_to_the_single_required_field(tools):
    decision = decide(run_(), [], acting(call("calc", "2 + 2")), tools, LIMITS)
    assert isinstance(decision, Act) and decision.rejected == []
    assert decision.planned[0].arguments == {"expression": "2 + 2"}


def test_string_is_coerced_when_other_fields_have_defaults(tools):
    decision = decide(run_(), [], acting(call("lookup", "capital of France")), tools, LIMITS)
    assert isinstance(decision, Act)
    assert decision.planned[0].arguments == {"query": "capital of France", "limit": 3}


def test_string_for_a_multi_field_tool_is_rejected(tools):
    content = _rejected(decide(run_(), [], acting(call("add", "1 and 2")), tools, LIMITS))
    assert "add takes a JSON object with fields ['a', 'b'], got a string" in content


def test_broken_json_object_is_not_coerced_into_the_field(tools):
    # tools mode: parse_tool_reply leaves unreadable JSON as the raw string
    turn = parse_tool_reply(None, [call("python", '{"code": "print(1)')])
    content = _rejected(decide(run_(), [], turn, tools, LIMITS))
    assert "not a valid JSON object" in content


def test_text_mode_plain_input_reaches_the_tool_as_its_field(tools):
    turn = parse_text("Thought: add up\nAction: calc\nAction Input: 17 * 3")
    decision = decide(run_(), [], turn, tools, LIMITS)
    assert isinstance(decision, Act)
    assert decision.planned[0].arguments == {"expression": "17 * 3"}
    assert decision.planned[0].call.id == "text-0"


# --- parallel calls ----------------------------------------------------------------------------


def test_parallel_calls_keep_their_order_and_flags(tools):
    turn = acting(
        call("calc", {"expression": "1"}, "a"),
        call("nope", {}, "b"),
        call("python", {"code": "print(2)"}, "c"),
        call("add", {"a": "x", "b": 1}, "d"),
        call("lookup", {"query": "y"}, "e"),
    )
    decision = decide(run_(), [], turn, tools, LIMITS)
    assert isinstance(decision, Act)
    assert [p.call.id for p in decision.planned] == ["a", "c", "e"]
    assert [o.call_id for o in decision.rejected] == ["b", "d"]
    assert [o.outcome for o in decision.rejected] == ["unknown_tool", "invalid_arguments"]
    flags = {p.tool: (p.sandboxed, p.idempotent) for p in decision.planned}
    assert flags == {"calc": (False, True), "python": (True, False), "lookup": (False, True)}
    assert all(p.hint is None for p in decision.planned)


# --- repetition ---------------------------------------------------------------------------------


def test_second_identical_call_gets_no_hint(tools):
    c = call("calc", {"expression": "2+2"})
    decision = decide(run_(), history_with(c), acting(c), tools, LIMITS)
    assert isinstance(decision, Act) and decision.planned[0].hint is None


def test_third_identical_call_gets_a_hint(tools):
    c = call("calc", {"expression": "2+2"})
    decision = decide(run_(), history_with(c, c), acting(c), tools, LIMITS)
    assert isinstance(decision, Act)
    hint = decision.planned[0].hint
    assert hint is not None
    assert "3 times" in hint and "calc" in hint
    assert "one more repetition ends the run" in hint


def test_fourth_identical_call_ends_the_run_as_a_loop(tools):
    c = call("calc", {"expression": "2+2"})
    decision = decide(run_(), history_with(c, c, c), acting(c), tools, LIMITS)
    assert isinstance(decision, End)
    assert decision.status == RunStatus.FAILED
    assert "4 times" in decision.reason and "loop" in decision.reason
    assert 'calc({"expression": "2+2"})' in decision.reason


def test_repetition_ignores_key_order_and_name_case(tools):
    earlier = [call("ADD", {"b": 2, "a": 1}), call("add", {"a": 1, "b": 2})]
    decision = decide(run_(), history_with(*earlier), acting(call("Add", {"a": 1, "b": 2})), tools, LIMITS)
    assert isinstance(decision, Act) and decision.planned[0].hint is not None


def test_repetition_is_judged_on_the_validated_arguments(tools):
    """A plain string for a one-field tool and the equivalent JSON object are the same call."""
    earlier = [call("calc", "2+2"), call("calc", {"expression": "2+2"}), call("calc", "2+2")]
    decision = decide(run_(), history_with(*earlier), acting(call("calc", {"expression": "2+2"})), tools, LIMITS)
    assert isinstance(decision, End) and "4 times" in decision.reason


def test_different_arguments_are_not_a_repetition(tools):
    earlier = [call("calc", {"expression": f"{i}+1"}) for i in range(5)]
    decision = decide(run_(), history_with(*earlier), acting(call("calc", {"expression": "9+1"})), tools, LIMITS)
    assert isinstance(decision, Act) and decision.planned[0].hint is None


def test_repetition_within_one_turn_counts(tools):
    c = {"expression": "7"}
    turn = acting(call("calc", c, "x"), call("calc", c, "y"), call("calc", c, "z"))
    decision = decide(run_(), [], turn, tools, LIMITS)
    assert isinstance(decision, Act)
    assert [p.hint is not None for p in decision.planned] == [False, False, True]


def test_repeated_unknown_tool_also_ends_as_a_loop(tools):
    c = call("nope", {"x": 1})
    decision = decide(run_(), history_with(c, c, c), acting(c), tools, LIMITS)
    assert isinstance(decision, End) and "loop" in decision.reason


def test_repetition_thresholds_are_configurable(tools):
    c = call("calc", {"expression": "1"})
    limits = Limits(repeat_hint_at=2, repeat_fail_at=3)
    hinted = decide(run_(), history_with(c), acting(c), tools, limits)
    assert isinstance(hinted, Act) and "2 times" in (hinted.planned[0].hint or "")
    assert isinstance(decide(run_(), history_with(c, c), acting(c), tools, limits), End)


def test_long_arguments_are_shortened_in_the_loop_reason(tools):
    c = call("calc", {"expression": "1+" * 200 + "1"})
    decision = decide(run_(), history_with(c, c, c), acting(c), tools, LIMITS)
    assert isinstance(decision, End)
    assert "…" in decision.reason and len(decision.reason) < 250


def test_call_signature_is_canonical():
    assert call_signature(" Calc ", {"b": 1, "a": 2}) == call_signature("calc", {"a": 2, "b": 1})
    assert call_signature("calc", "2+2") != call_signature("calc", "2+3")
    assert call_signature("calc", {"a": 1}) != call_signature("lookup", {"a": 1})


def test_planned_call_is_immutable(tools):
    decision = decide(run_(), [], acting(call("calc", {"expression": "1"})), tools, LIMITS)
    assert isinstance(decision, Act)
    planned: PlannedCall = decision.planned[0]
    with pytest.raises(AttributeError):
        planned.hint = "x"  # type: ignore[misc]
