"""Prompt building: the system templates (variables, examples, an operator's override, StrictUndefined),
message shapes in both modes, reflection, compaction to the context budget; and, through a real worker and
the stub, that `reactq trace --prompt` prints what the model was sent."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from worker.config import Settings
from worker.core.models import Mode, Observation, Step, ToolCall
from worker.core.prompts import (
    REFLECTION,
    PromptContext,
    build_messages,
    estimate_tokens,
    format_example,
    step_messages,
    summarize_step,
    system_message,
)
from worker.prompt_templates import system_template
from worker.tools.registry import Tool

SUMMARY_PREFIX = "Summary of earlier steps (compacted to fit the context window):\n"
BIG = 10**9  # a context budget nothing reaches


class ExprArgs(BaseModel):
    expression: str


class LookupArgs(BaseModel):
    query: str
    limit: int = 3


TOOLS = [
    Tool("calc", ExprArgs, "Evaluate arithmetic.", returns="the number", when="for arithmetic"),
    Tool("lookup", LookupArgs, "Find facts."),
]
SHIPPED = {mode: system_template(Settings(), mode) for mode in Mode}


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


def build(mode: Mode, steps, budget: int = BIG, tools=TOOLS, **kw):
    return build_messages(mode, "What is 6 * 7?", steps, tools, context_budget_tokens=budget,
                          system_template=SHIPPED[mode], **kw)


# --- the system templates --------------------------------------------------------------------------

CONTEXT = PromptContext(agent_name="Athena-7", date="2031-02-03", max_steps=11, max_retries=5, repeat_limit=2,
                        plan_instructions="Cite the source.", run_instructions="Answer in French.")


def system_of(mode: Mode, tools=None, context: PromptContext = CONTEXT, template=None) -> str:
    messages, _ = build_messages(mode, "q", [], TOOLS if tools is None else tools, context_budget_tokens=BIG,
                                 system_template=template or SHIPPED[mode], prompt=context)
    return messages[0]["content"]


@pytest.mark.parametrize("mode", list(Mode))
def test_every_variable_reaches_the_prompt(mode):
    content = system_of(mode)
    assert content.startswith("You are Athena-7, ")
    assert "Today's date is 2031-02-03 (UTC)." in content
    assert "at most 11 steps" in content
    assert "retried at most 5 times in a row" in content and "more than 2 times" in content
    assert "Instructions from the operator:\nCite the source." in content
    assert "Instructions for this run (they do not override the rules above):\nAnswer in French." in content
    for tool in TOOLS:
        assert tool.name in content and tool.description in content


@pytest.mark.parametrize("mode", list(Mode))
def test_every_shipped_template_uses_every_variable(mode):
    """A variable the builder fills but no template reads is advice the model never gets."""
    import jinja2
    from jinja2 import meta

    from worker.core.prompts import prompt_variables
    from worker.prompt_templates import template_path

    source = template_path(mode).read_text()
    used = meta.find_undeclared_variables(jinja2.Environment().parse(source))
    unused = set(prompt_variables(mode, [], PromptContext())) - used
    assert unused == ({"mode", "tool_names"} if mode == Mode.TOOLS else {"mode"})


@pytest.mark.parametrize("mode", list(Mode))
def test_the_rules_are_in_both_modes(mode):
    content = system_of(mode).lower()
    for rule in ("if you are unsure", "look it up", "answer only from", "stop as soon as you have enough",
                 "after two failed", "give your best answer", "if no tool fits, rephrase"):
        assert rule in content, rule


@pytest.mark.parametrize("mode", list(Mode))
def test_no_instructions_no_section(mode):
    content = system_of(mode, context=PromptContext())
    assert "Instructions" not in content
    assert "Today's date is 1970-01-01 (UTC)." in content


def test_text_mode_examples_are_what_the_parser_reads():
    """The three worked examples (a tool call, a direct answer, a recovery from an error) parse as the
    calls and answers they show, with the tool names of the listing."""
    from worker.core.parser import parse_text
    from worker.tools import REGISTRY

    content = system_of(Mode.TEXT, tools=[REGISTRY.get("calculator"), REGISTRY.get("search")],
                        context=PromptContext())
    examples = content.split("Examples:\n", 1)[1].split("\nQuestion: ")
    turns = [turn for example in examples if example.strip() for turn in example.split("\nObservation: ")]
    parsed = [parse_text(turn[turn.index("Thought:"):]) for turn in turns]
    calls = [(r.calls[0].name, r.calls[0].arguments) for r in parsed if r.calls]
    assert calls == [("calculator", {"expression": "17 * 23"}), ("search", {"query": ""}),
                     ("search", {"query": "Nomadland director"})]
    assert [r.final_answer for r in parsed if r.final_answer] == ["391", "merci", "Chloé Zhao"]
    assert "Observation: invalid arguments for search" in content  # the recovery shows the error it fixes


def test_text_mode_names_only_offered_tools():
    """The stub (and a model) read tool names from the system prompt: examples use only offered tools."""
    import re

    from worker.tools import REGISTRY

    content = system_of(Mode.TEXT, tools=[REGISTRY.get("calculator")], context=PromptContext()).lower()
    assert "calculator" in content
    assert not re.search(r"\b(search|python)\b", content)
    generic = system_of(Mode.TEXT, tools=[TOOLS[1]], context=PromptContext())
    assert "Action: lookup\nAction Input: {\"query\": \"capital of France\"}" in generic
    assert "calculator" not in generic


@pytest.mark.parametrize("mode", list(Mode))
def test_no_tools_still_renders(mode):
    assert "no tools" in system_of(mode, tools=[])


def test_builtin_tools_say_what_they_return_and_when():
    from worker.tools import REGISTRY

    content = system_of(Mode.TEXT, tools=REGISTRY.all())
    for name in ("calculator", "search", "python"):
        tool = REGISTRY.get(name)
        assert tool.returns and tool.when
        assert f"Tool: {name}\n" in content
        assert f"  Returns: {tool.returns}\n" in content
    assert 'Example Action Input: {"expression": "(17 + 25) * 3"}' in content


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_an_operator_replaces_the_templates(tmp_path):
    write(tmp_path / "tools.j2", "I am {{ agent_name }} on {{ date }}; tools: {{ tool_names | join(',') }}\n")
    write(tmp_path / "text.j2", "TEXT {{ agent_name }}: {% for t in tools %}{{ t.name }}={{ t.example }} {% endfor %}")
    settings = Settings(prompt_templates_dir=str(tmp_path))
    assert system_of(Mode.TOOLS, template=system_template(settings, Mode.TOOLS)) == \
        "I am Athena-7 on 2031-02-03; tools: calc,lookup"
    assert system_of(Mode.TEXT, template=system_template(settings, Mode.TEXT)) == \
        'TEXT Athena-7: calc={"expression": "2 + 3 * 4"} lookup={"query": "capital of France"}'
    one = write(tmp_path / "one.j2", "only {{ mode }}")
    settings = Settings(prompt_templates_dir=str(tmp_path), prompt_text_template=str(one))
    assert system_of(Mode.TEXT, template=system_template(settings, Mode.TEXT)) == "only text"
    assert system_of(Mode.TOOLS, template=system_template(settings, Mode.TOOLS)).startswith("I am Athena-7")


def test_templates_are_compiled_once(tmp_path):
    write(tmp_path / "tools.j2", "a")
    write(tmp_path / "text.j2", "b")
    settings = Settings(prompt_templates_dir=str(tmp_path))
    assert system_template(settings, Mode.TOOLS) is system_template(settings, Mode.TOOLS)
    assert system_template(Settings(), Mode.TEXT) is SHIPPED[Mode.TEXT]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Hi {{ agent_nme }}", "'agent_nme' is undefined; the variables are agent_name, date,"),
        ("{% for t in tools %}{{ t.nme }}{% endfor %}", "has no attribute 'nme'"),
        ("Hi {{ agent_name ", "line 1: unexpected end of template"),
        ("{{ max_steps / 0 }}", "fails to render: ZeroDivisionError"),
    ],
)
def test_a_broken_template_is_refused_when_the_settings_load(tmp_path, text, message):
    from pydantic import ValidationError

    write(tmp_path / "tools.j2", "fine")
    write(tmp_path / "text.j2", text)
    with pytest.raises(ValidationError) as caught:
        Settings(prompt_templates_dir=str(tmp_path))
    assert "prompt template " + str(tmp_path / "text.j2") in str(caught.value)
    assert message in str(caught.value)


def test_a_missing_template_file_is_refused(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="cannot read prompt template .*tools.j2: No such file"):
        Settings(prompt_templates_dir=str(tmp_path))


def test_the_date_is_the_runs_utc_day_unless_overridden():
    from worker.core.prompts import run_date

    assert run_date(0.0) == "1970-01-01"
    assert run_date(1_700_000_000.0) == "2023-11-14"  # 22:13 UTC
    assert run_date(1_700_000_000.0, "2024-05-01") == "2024-05-01"
    assert Settings(prompt_date="2024-05-01").prompt_date.isoformat() == "2024-05-01"
    with pytest.raises(ValueError):
        Settings(prompt_date="yesterday")


def test_a_plan_names_the_agent_and_adds_instructions():
    from worker.errors import PlanConfigError
    from worker.tenancy.plans import parse_plans

    base = ("[plans.p]\ntiers = ['free']\n"
            "[plans.p.limits]\nruns_in_flight = 1\nsubmissions_per_minute = 1\nsse_streams = 1\n")
    plain = parse_plans(base)["p"]
    assert plain.agent_name is None and plain.instructions == ""
    named = parse_plans(base.replace("tiers", "agent_name = 'FinBot'\ninstructions = 'Quote sources.'\ntiers"))["p"]
    assert (named.agent_name, named.instructions) == ("FinBot", "Quote sources.")
    with pytest.raises(PlanConfigError, match="instructions: String should have at most 4000"):
        parse_plans(base.replace("tiers", f"instructions = '{'x' * 4001}'\ntiers"))
    with pytest.raises(PlanConfigError, match="agent_name"):
        parse_plans(base.replace("tiers", "agent_name = ''\ntiers"))


def test_run_instructions_are_bounded_everywhere():
    import click
    from pydantic import ValidationError

    from worker.api.routes_runs import RunRequest
    from worker.cli.runs import _check_instructions
    from worker.core.models import MAX_INSTRUCTIONS_CHARS, RunSpec
    from worker.service.batch_input import BatchLine

    fits, too_long = "x" * MAX_INSTRUCTIONS_CHARS, "x" * (MAX_INSTRUCTIONS_CHARS + 1)
    assert MAX_INSTRUCTIONS_CHARS == 2000
    assert RunSpec(question="q", instructions=fits).instructions == fits
    assert RunSpec(question="q").instructions is None
    for model in (RunSpec, RunRequest, BatchLine):
        with pytest.raises(ValidationError, match="at most 2000 characters"):
            model(question="q", instructions=too_long)
    with pytest.raises(ValidationError):
        RunSpec(question="q", instructions="bad \ud800 surrogate")
    assert _check_instructions(None, None, fits) == fits  # type: ignore[arg-type]
    with pytest.raises(click.BadParameter, match="2001 characters; the limit is 2000"):
        _check_instructions(None, None, too_long)  # type: ignore[arg-type]


def test_instructions_travel_from_the_api_and_a_batch_line_into_the_spec(tmp_path):
    from worker.api.routes_runs import RunRequest, run_spec
    from worker.service.batch_input import ParsedLine, iter_input
    from worker.tenancy.plans import load_plans
    from worker.tenancy.tenants import Policy

    plan = load_plans()["standard"]
    spec = run_spec(RunRequest(question="q", instructions="Be brief."), Policy("acme", plan, plan.budgets), "")
    assert spec.instructions == "Be brief."
    lines = tmp_path / "in.jsonl"
    too_long = "x" * 2001
    lines.write_text(json.dumps({"id": "a", "question": "q", "instructions": "Cite."}) + "\n"
                     + json.dumps({"id": "b", "question": "q", "instructions": too_long}) + "\n")
    first, second = list(iter_input(lines, Settings(), None, None))
    assert isinstance(first, ParsedLine) and first.spec.instructions == "Cite."
    assert str(second) == "line 2: instructions: String should have at most 2000 characters"


def test_a_runs_prompt_context_comes_from_its_plan_settings_and_record():
    """What runner._ask and `trace --prompt` both use: the plan's name and instructions win over the
    settings', the date is the run's creation day, the limits are the run's and the settings'."""
    from types import SimpleNamespace

    from worker.core.models import Run, RunSpec
    from worker.runtime.prompt_inputs import prompt_context
    from worker.tenancy.plans import load_plans
    from worker.tenancy.tenants import Policy

    plan = load_plans()["standard"].model_copy(update={"agent_name": "FinBot", "instructions": "Quote sources."})
    policies = {"acme": Policy("acme", plan, plan.budgets), "solo": None}
    settings = Settings(agent_name="Generic", max_invalid_outputs=4, repeat_fail_at=5)
    rt = SimpleNamespace(settings=settings, tenants=SimpleNamespace(policy=policies.get))
    run = Run(spec=RunSpec(question="q", tenant="acme", instructions="In French."), max_steps=9,
              created_at=1_700_000_000.0)
    assert prompt_context(rt, run) == PromptContext(  # type: ignore[arg-type]
        agent_name="FinBot", date="2023-11-14", max_steps=9, max_retries=3, repeat_limit=4,
        plan_instructions="Quote sources.", run_instructions="In French.")
    solo = run.model_copy(update={"spec": RunSpec(question="q", tenant="solo")})
    context = prompt_context(rt, solo)  # type: ignore[arg-type]
    assert (context.agent_name, context.plan_instructions, context.run_instructions) == ("Generic", "", "")
    rt.settings = Settings(prompt_date="2024-05-01")
    assert prompt_context(rt, solo).date == "2024-05-01"  # type: ignore[arg-type]


# --- message shapes ------------------------------------------------------------------------------


def test_tools_mode_head():
    messages, compacted = build(Mode.TOOLS, [])
    assert compacted == 0
    system, question = messages
    assert system["role"] == "system"
    assert system["content"].startswith("You are reactq, a careful assistant")
    assert "- calc: Evaluate arithmetic. Returns the number. Use it for arithmetic." in system["content"]
    assert "- lookup: Find facts." in system["content"]
    assert question == {"role": "user", "content": "What is 6 * 7?"}


def test_text_mode_head_lists_the_tools():
    messages, _ = build(Mode.TEXT, [])
    system, question = messages
    assert system["role"] == "system"
    content = system["content"]
    assert "Tool: calc\n  What it does: Evaluate arithmetic.\n  Parameters:\n    - expression (string, required)\n" \
        '  Example Action Input: {"expression": "2 + 3 * 4"}\n  Returns: the number\n' \
        "  Use it: for arithmetic\n" in content
    assert "Tool: lookup\n" in content
    assert "    - query (string, required)\n    - limit (integer)\n" in content
    assert 'Example Action Input: {"query": "capital of France"}' in content  # optional fields stay out
    assert "one of [calc, lookup]" in content
    assert "Final Answer:" in content
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


# --- what `reactq trace --prompt` prints is what the model was sent (a real worker, the real stub) -----


class RecordingProxy:
    """An HTTP server on loopback between the worker and the stub: forwards each request and keeps the
    JSON body of every chat completion request."""

    def __init__(self, target_root: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import httpx

        self.bodies: list[dict] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/chat/completions"):
                    proxy.bodies.append(json.loads(raw))
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json"),
                           "Authorization": self.headers.get("Authorization", "")}
                answer = httpx.post(target_root + self.path, content=raw, headers=headers, timeout=60)
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def sent_for(self, question_prefix: str) -> list[list[dict]]:
        """The messages of each request of the run whose question starts so, in order."""
        return [b["messages"] for b in self.bodies if question_prefix in b["messages"][1]["content"]]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.integration
@pytest.mark.parametrize("mode", list(Mode))
def test_trace_prompt_prints_what_the_model_was_sent(mode, redis_url, stub_base_url, tmp_path):
    from tests.fixtures_cluster import Cluster, cluster_environment

    proxy = RecordingProxy(stub_base_url.removesuffix("/v1"))
    env = {**cluster_environment(redis_url, proxy.base_url), "REACTQ_MODE": mode.value,
           "REACTQ_PROMPT_DATE": "2024-06-30", "REACTQ_AGENT_NAME": "Athena-7"}
    cluster = Cluster(env, tmp_path)
    try:
        cluster.start_worker(queues="steps")
        question = "What is 17 * 23 + 4?"
        asked = cluster.reactq("ask", question, "--wait", "--json", "--instructions", "Answer with digits only.")
        assert asked.returncode == 0, asked.stderr
        run = json.loads(asked.stdout)
        assert run["status"] == "succeeded" and "395" in run["answer"]
        sent = proxy.sent_for(question)
        assert len(sent) == run["steps"] >= 2  # a calculator call, then the answer
        system = sent[0][0]["content"]
        assert system.startswith("You are Athena-7, ")
        assert "Today's date is 2024-06-30 (UTC)." in system
        assert system.endswith("Instructions for this run (they do not override the rules above):\n"
                               "Answer with digits only.")
        for step, messages in enumerate(sent, start=1):
            traced = cluster.reactq("trace", run["run_id"], "--prompt", "--step", str(step), "--json")
            assert traced.returncode == 0, traced.stderr
            shown = json.loads(traced.stdout)
            assert (shown["step"], shown["mode"]) == (step, mode.value)
            assert shown["messages"] == messages
            assert messages[0]["content"] == system  # one system prompt for every turn of the run
        default = json.loads(cluster.reactq("trace", run["run_id"], "--prompt", "--json").stdout)
        assert default["messages"] == sent[-1]
        readable = cluster.reactq("trace", run["run_id"], "--prompt")
        assert readable.returncode == 0 and "You are Athena-7" in readable.stdout
        beyond = cluster.reactq("trace", run["run_id"], "--prompt", "--step", str(len(sent) + 2))
        assert beyond.returncode == 2 and f"--step is at most {len(sent) + 1}" in beyond.stderr
    finally:
        cluster.stop()
        proxy.stop()


# --- examples built from a tool's JSON schema: plausible values, never placeholders


@pytest.mark.parametrize(("schema", "expected"), [
    ({"properties": {"expression": {"type": "string"}}, "required": ["expression"]}, {"expression": "2 + 3 * 4"}),
    ({"properties": {"q": {"type": "string", "examples": ["Nomadland director"]}}}, {"q": "Nomadland director"}),
    ({"properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]},
     {"unit": "celsius"}),
    ({"properties": {"n": {"type": "integer", "minimum": 10, "maximum": 20}}, "required": ["n"]}, {"n": 10}),
    ({"properties": {"n": {"type": "integer", "maximum": 2}}, "required": ["n"]}, {"n": 2}),
    ({"properties": {"x": {"type": "number", "default": 0.5}}, "required": ["x"]}, {"x": 0.5}),
    ({"properties": {"flag": {"type": "boolean"}}, "required": ["flag"]}, {"flag": True}),
    ({"properties": {"when": {"type": "string", "format": "date"}}, "required": ["when"]}, {"when": "2024-01-31"}),
    ({"properties": {"city_name": {"type": "string"}}, "required": ["city_name"]}, {"city_name": "Paris"}),
    ({"properties": {"zzz": {"type": "string", "minLength": 10, "maxLength": 12}}, "required": ["zzz"]},
     {"zzz": "examplexxx"}),
    ({"properties": {"tags": {"type": "array", "items": {"type": "string"}}}, "required": ["tags"]},
     {"tags": ["example"]}),
    ({"properties": {"opt": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "required": ["opt"]}, {"opt": 3}),
    ({"properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}, {"a": "example"}),  # none required
    ({"properties": {}}, {}),
    ({}, {}),
    ({"properties": {"inner": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}},
      "required": ["inner"]}, {"inner": {"url": "https://example.com"}}),
])  # fmt: skip
def test_example_arguments_are_plausible_values(schema, expected):
    from worker.core.prompts import example_arguments

    assert example_arguments(schema) == expected


def test_example_arguments_are_accepted_by_the_builtin_tools():
    from worker.core.prompts import format_example
    from worker.tools import REGISTRY

    for tool in REGISTRY.all():
        example = format_example([tool])
        assert example is not None and example.tool == tool.name
        tool.validate(json.loads(example.arguments))  # raises if the example is not valid for the tool
        assert "..." not in example.arguments and "<" not in example.arguments


def test_format_example_is_the_first_offered_tool_as_the_prompt_shows_it():
    from worker.core.prompts import format_example

    assert format_example([]) is None
    example = format_example(TOOLS)
    assert (example.tool, example.arguments) == ("calc", '{"expression": "2 + 3 * 4"}')
    content = system_of(Mode.TEXT, context=PromptContext())
    assert f"Action: {example.tool}\nAction Input: {example.arguments}" in content


class CountingTemplate:
    """A template that counts its renders (hashable by identity, as a compiled jinja2 template is)."""

    def __init__(self) -> None:
        self.renders = 0

    def render(self, variables: dict) -> str:
        self.renders += 1
        return f"agent {variables['agent_name']} on {variables['date']} with {variables['tool_names']}"


class UnhashableTool:
    """A tool description with a mutable field: not hashable, as an MCP server's tool may be."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, tool: Tool) -> None:
        self.tool, self.name, self.description = tool, tool.name, tool.description
        self.returns, self.when, self.annotations = tool.returns, tool.when, {}

    def openai_schema(self) -> dict:
        return self.tool.openai_schema()


def test_the_system_prompt_is_rendered_once_per_tools_template_and_context():
    template = CountingTemplate()
    today, tomorrow = PromptContext(date="2026-12-06"), PromptContext(date="2026-12-07")
    first = system_message(Mode.TOOLS, TOOLS, template, today)
    again = system_message(Mode.TOOLS, list(TOOLS), template, today)
    assert again == first and again is not first  # each caller gets its own message
    assert template.renders == 1
    assert "2026-12-07" in system_message(Mode.TOOLS, TOOLS, template, tomorrow)["content"]
    assert "['calc']" in system_message(Mode.TOOLS, TOOLS[:1], template, today)["content"]
    assert template.renders == 3  # another context, other tools: rendered anew


def test_a_system_prompt_with_an_output_schema_or_an_unhashable_tool_is_rendered_each_time():
    template = CountingTemplate()
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    with_schema = PromptContext(date="2026-12-06", output_schema=schema)
    for _ in range(2):
        assert '"answer"' in system_message(Mode.TOOLS, TOOLS, template, with_schema)["content"]
    tools = [UnhashableTool(t) for t in TOOLS]
    for _ in range(2):
        content = system_message(Mode.TOOLS, tools, template, PromptContext(date="2026-12-06"))["content"]
        assert "['calc', 'lookup']" in content
    assert template.renders == 4
    assert format_example(tools) == format_example(TOOLS)
