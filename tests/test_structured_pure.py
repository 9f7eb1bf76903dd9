"""Structured final answers, pure parts: the engine's decision on a run with an output schema (valid,
invalid then valid, never valid, the shared format-error budget), the schema's checks at submission
(worker/output_schema.py, the real jsonschema library), the prompt's section and the stub's object maker."""

from __future__ import annotations

import json

import pytest

from api_stub.brain import respond
from api_stub.structured import fill, offered_schema
from worker.config import Settings
from worker.core import best_effort
from worker.core.engine import Act, End, Final, Limits, Retry, decide
from worker.core.models import Mode, Run, RunSpec, RunStatus, ToolCall
from worker.core.parser import ParsedTurn, parse_text, parse_tool_reply
from worker.core.prompts import PromptContext, build_messages
from worker.core.structured import FINAL_TOOL, call_text, final_tool
from worker.output_schema import MAX_OUTPUT_SCHEMA_BYTES, JsonSchemaCheck, output_check, schema_problem
from worker.prompt_templates import system_template

from .test_engine import registry

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
CHECK = JsonSchemaCheck(SCHEMA)
LIMITS = Limits(max_invalid_outputs=3)


def run_(mode: Mode = Mode.TOOLS, streak: int = 0) -> Run:
    return Run(spec=RunSpec(question="q", output_schema=SCHEMA), mode=mode, invalid_streak=streak)


def final_call(arguments: dict | str) -> ParsedTurn:
    return parse_tool_reply(None, [ToolCall(id="f1", name=FINAL_TOOL, arguments=arguments)])


def decide_(turn: ParsedTurn, mode: Mode = Mode.TOOLS, streak: int = 0, check=CHECK):
    return decide(run_(mode, streak), [], turn, registry(), LIMITS, output=check)


# --- the engine --------------------------------------------------------------------------------------------
def test_a_valid_final_answer_call_is_the_final_answer_with_its_object():
    decision = decide_(final_call({"city": "Paris", "population": 2100000}))
    assert isinstance(decision, Final)
    assert decision.output == {"city": "Paris", "population": 2100000}
    assert json.loads(decision.answer) == decision.output


def test_final_answer_arguments_sent_as_a_json_string_are_read():
    decision = decide_(final_call('{"city": "Oslo", "population": 700000}'))
    assert isinstance(decision, Final) and decision.output == {"city": "Oslo", "population": 700000}


def test_an_object_the_schema_refuses_is_a_retry_naming_where_and_what():
    decision = decide_(final_call({"city": "Paris", "population": "two million"}))
    assert isinstance(decision, Retry)
    assert decision.kind == "output_invalid"
    assert "$.population" in decision.error and "is not of type 'integer'" in decision.error
    assert "final_answer" in decision.error  # says how to answer again


def test_a_missing_required_field_is_named():
    decision = decide_(final_call({"city": "Paris"}))
    assert isinstance(decision, Retry) and "'population' is a required property" in decision.error


def test_invalid_then_valid_the_run_finishes_with_the_valid_object():
    first = decide_(final_call({"city": 3, "population": 1}))
    assert isinstance(first, Retry)
    second = decide_(final_call({"city": "Rome", "population": 2800000}), streak=1)
    assert isinstance(second, Final) and second.output == {"city": "Rome", "population": 2800000}


def test_never_valid_ends_failed_with_the_last_validation_error():
    decision = decide_(final_call({"city": "Paris", "population": 1, "mayor": "x"}), streak=2)
    assert isinstance(decision, End)
    assert decision.status == RunStatus.FAILED and decision.safeguard == "invalid_outputs"
    assert "3 invalid model outputs in a row" in decision.reason
    assert "last validation error: at $: Additional properties are not allowed ('mayor'" in decision.reason


def test_schema_errors_and_other_format_errors_share_one_budget():
    """Two unreadable turns before it: the third invalid output, a schema refusal, ends the run."""
    empty = parse_tool_reply("", [])
    assert isinstance(decide_(empty, streak=0), Retry)
    assert isinstance(decide_(empty, streak=1), Retry)
    assert isinstance(decide_(final_call({"city": "x"}), streak=2), End)
    assert isinstance(decide(run_(streak=1), [], final_call({"city": "x"}), registry(),
                             Limits(max_invalid_outputs=4), output=CHECK), Retry)


def test_tools_mode_plain_text_json_is_taken_and_prose_is_refused():
    ok = decide_(parse_tool_reply('{"city": "Lima", "population": 10000000}', []))
    assert isinstance(ok, Final) and ok.output == {"city": "Lima", "population": 10000000}
    prose = decide_(parse_tool_reply("The city is Lima.", []))
    assert isinstance(prose, Retry) and "it is not JSON" in prose.error


def test_text_mode_final_answer_must_be_the_object():
    ok = decide_(parse_text('Thought: done\nFinal Answer: {"city": "Kyiv", "population": 3000000}'), Mode.TEXT)
    assert isinstance(ok, Final) and ok.output == {"city": "Kyiv", "population": 3000000}
    fenced = decide_(parse_text('Final Answer: ```json\n{"city": "Kyiv", "population": 3}\n```'), Mode.TEXT)
    assert isinstance(fenced, Final) and fenced.output == {"city": "Kyiv", "population": 3}
    prose = decide_(parse_text("Thought: done\nFinal Answer: Kyiv, about 3 million"), Mode.TEXT)
    assert isinstance(prose, Retry) and prose.error.startswith("Invalid format: your final answer does not fit")
    listed = decide_(parse_text('Final Answer: [{"city": "Kyiv"}]'), Mode.TEXT)
    assert isinstance(listed, Retry) and "it is a JSON list, not an object" in listed.error


def test_the_stub_answers_in_text_when_tools_are_disabled():
    """tool_choice "none" (the best-effort call at a limit): the object is the reply's text, no call."""
    reply = respond([{"role": "system", "content": "s"}, {"role": "user", "content": "How many days are there in "
                                                                                      "a week?"}],
                    [final_tool(SCHEMA)], final_only=True)
    assert not reply.tool_calls and reply.content is not None
    assert CHECK.problem(json.loads(reply.content)) is None


def test_a_refused_call_is_kept_as_text_for_the_trace():
    assert call_text(final_call({"city": "x"}).calls) == 'final_answer({"city": "x"})'
    assert call_text([ToolCall(id="a", name="calc", arguments={})]) is None


@pytest.mark.parametrize("mode", list(Mode))
def test_the_best_effort_call_of_a_structured_run_asks_for_the_object(mode):
    end = End(RunStatus.MAX_STEPS, "max")
    sent, _ = best_effort.final_request(mode, [], {}, end, structured=True)
    assert sent[-1]["content"].endswith("The answer must be the JSON object the output schema describes.")
    plain, _ = best_effort.final_request(mode, [], {}, end)
    assert "JSON object" not in plain[-1]["content"]


def test_final_answer_with_other_calls_is_refused():
    turn = parse_tool_reply(None, [ToolCall(id="a", name="calc", arguments={"expression": "1+1"}),
                                   ToolCall(id="f", name=FINAL_TOOL, arguments={"city": "x", "population": 1})])
    decision = decide_(turn)
    assert isinstance(decision, Retry) and "call it alone" in decision.error


def test_tool_calls_still_act_on_a_structured_run():
    turn = parse_tool_reply(None, [ToolCall(id="a", name="calc", arguments={"expression": "1+1"})])
    assert isinstance(decide_(turn), Act)


def test_without_a_schema_final_answer_is_an_unknown_tool_and_text_is_the_answer():
    decision = decide(Run(spec=RunSpec(question="q")), [], final_call({"city": "x"}), registry(), LIMITS)
    assert isinstance(decision, Act) and decision.rejected[0].outcome == "unknown_tool"
    plain = decide(Run(spec=RunSpec(question="q")), [], parse_tool_reply("Lima", []), registry(), LIMITS)
    assert isinstance(plain, Final) and plain.output is None


# --- the schema at submission -----------------------------------------------------------------------------
@pytest.mark.parametrize(("schema", "words"), [
    ([1, 2], "must be a JSON object"),
    ({"type": "array"}, 'its root needs "type": "object"'),
    ({"type": "object", "properties": {"a": {"type": 5}}}, "not a valid JSON Schema (at properties/a/type)"),
    ({"type": "object", "properties": {"a": {"$ref": "https://evil.example/s.json"}}}, "a $ref outside itself"),
    ({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}, "a $ref outside itself"),
    ({"type": "object", "$id": "https://evil.example/root"}, "uses $id"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}, "a $ref that points at nothing in it"),
    ({"type": "object", "$schema": "https://evil.example/meta"}, "$schema must name a JSON Schema draft"),
    ({"type": "object", "$schema": 5}, "$schema must name a JSON Schema draft"),
    ({"type": "object", "properties": {"a": {"$dynamicRef": "#meta"}}}, "uses $dynamicRef"),
    ({"type": "object", "description": "x" * MAX_OUTPUT_SCHEMA_BYTES}, "the limit is 16384"),
    ({"type": "object", "description": "\ud800"}, "not valid Unicode"),
])
def test_bad_schemas_are_refused_with_a_clear_reason(schema, words):
    problem = schema_problem(schema)
    assert problem is not None and words in problem


def test_a_deeply_nested_schema_is_refused():
    schema: dict = {"type": "object"}
    node = schema
    for _ in range(40):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    assert "nested more than 32 levels" in (schema_problem(schema) or "")


def test_good_schemas_pass_local_refs_included():
    assert schema_problem(SCHEMA) is None
    local = {"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}},
             "$schema": "https://json-schema.org/draft/2020-12/schema"}
    assert schema_problem(local) is None
    check = output_check(local)
    assert check is not None and check.problem({"a": 1}) is None
    assert "is not of type 'integer'" in (check.problem({"a": "x"}) or "")


def test_a_remote_ref_is_never_fetched_even_when_validating():
    """The check's registry is empty: a remote $ref (refused at submission anyway) fails, it is not loaded."""
    check = JsonSchemaCheck({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/s.json"}}})
    assert check.problem({"a": 1}) == ("the answer could not be checked: the schema has a reference that does "
                                       "not resolve")


def test_a_schema_that_refers_to_itself_without_end_is_a_problem_not_a_crash():
    endless = {"type": "object", "$ref": "#"}
    assert schema_problem(endless) is None  # a recursive schema is legitimate; this one never ends
    assert JsonSchemaCheck(endless).problem({}) == "the answer could not be checked: the schema refers to itself " \
                                                   "without end"


# --- the prompt ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(Mode))
def test_the_system_prompt_shows_the_schema_and_how_to_answer(mode):
    messages, _ = build_messages(mode, "q", [], [], context_budget_tokens=100_000,
                                 system_template=system_template(Settings(), mode),
                                 prompt=PromptContext(output_schema=SCHEMA))
    system = messages[0]["content"]
    assert json.dumps(SCHEMA, sort_keys=True) in system
    assert ("call the final_answer tool" in system) == (mode == Mode.TOOLS)
    plain, _ = build_messages(mode, "q", [], [], context_budget_tokens=100_000,
                              system_template=system_template(Settings(), mode))
    assert "JSON Schema" not in plain[0]["content"]


# --- the stub's object maker -------------------------------------------------------------------------------
def test_fill_makes_an_object_from_the_schema_and_the_answer():
    schema = {"type": "object", "$defs": {"u": {"enum": ["celsius", "kelvin"]}},
              "properties": {"value": {"type": "integer", "maximum": 500}, "unit": {"$ref": "#/$defs/u"},
                             "exact": {"type": "boolean"}, "notes": {"type": "array", "items": {"type": "string"}},
                             "kind": {"const": "temperature"}}}
    made = fill(schema, "It is 300 kelvin")
    assert made == {"value": 300, "unit": "kelvin", "exact": True, "notes": ["It is 300 kelvin"],
                    "kind": "temperature"}
    assert JsonSchemaCheck(schema).problem(made) is None


def test_the_stub_answers_by_the_schema_in_both_modes():
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}}}}, final_tool(SCHEMA)]
    question = {"role": "user", "content": "What is 6 * 7?"}
    first = respond([{"role": "system", "content": "s"}, question], tools)
    assert first.tool_calls[0].name == "calculator"
    done = respond([{"role": "system", "content": "s"}, question,
                    {"role": "assistant", "content": None, "tool_calls": [first.tool_calls[0].to_openai()]},
                    {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "42"}], tools)
    assert done.tool_calls[0].name == FINAL_TOOL
    assert json.loads(done.tool_calls[0].arguments) == {"city": "42", "population": 42}
    messages, _ = build_messages(Mode.TEXT, "How many days are there in a week?", [], [], context_budget_tokens=100_000,
                                 system_template=system_template(Settings(), Mode.TEXT),
                                 prompt=PromptContext(output_schema=SCHEMA))
    assert offered_schema(messages, None) == SCHEMA
    text = respond(messages, None)
    assert text.content is not None
    answer = json.loads(text.content.split("Final Answer:", 1)[1])
    assert answer == {"city": "There are 7 days in a week.", "population": 7}
