"""Prompt building: the conversation is rebuilt from the run's steps on every turn. Pure.

The system prompt is a template per mode (worker/core/templates/*.j2, compiled once by
worker/prompt_templates.py) rendered with `prompt_variables`: the agent's name, the tools (description,
parameters, example, returns, when to use), the limits, the run's date and extra instructions. This
module never imports the template engine: it is handed a compiled template (`SystemTemplate`).

When the conversation would exceed the context budget, older steps are compacted into one summary
message (every older step keeps a line); the system prompt, the question and the latest steps stay.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from .models import Mode, Step, ToolCall

Message = dict[str, Any]

REFLECTION = (
    "Reflect before going on: what have you learned so far, is your approach working, "
    "and what is the most useful next step?"
)


class ToolDescription(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def returns(self) -> str: ...

    @property
    def when(self) -> str: ...

    def openai_schema(self) -> dict[str, Any]: ...


class SystemTemplate(Protocol):
    """A compiled template (a jinja2.Template): rendering is pure."""

    def render(self, *args: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class PromptContext:
    """What the system prompt says beside the tools: who the agent is, its limits, the date, and the
    operator's (plan) and the submitter's (run) extra instructions."""

    agent_name: str = "reactq"
    date: str = "1970-01-01"  # the run's date (UTC, YYYY-MM-DD): fixed per run, see run_date
    max_steps: int = 8
    max_retries: int = 2  # invalid outputs retried in a row (the next one ends the run)
    repeat_limit: int = 3  # the same call with the same arguments at most this many times (one more ends it)
    plan_instructions: str = ""
    run_instructions: str = ""


def run_date(created_at: float, override: str | None = None) -> str:
    """The date a run's prompt states: REACTQ_PROMPT_DATE if set, else the UTC day the run was created, so
    every turn of a run (and `reactq trace --prompt` later) sees the same system prompt."""
    return override or datetime.fromtimestamp(created_at, UTC).date().isoformat()


_EXAMPLE_BY_TYPE: dict[str, Any] = {"string": "...", "integer": 1, "number": 1.5, "boolean": True,
                                    "array": [], "object": {}}


def _param_type(prop: Mapping[str, Any]) -> str:
    if "type" in prop:
        return str(prop["type"])
    options = [str(o.get("type")) for o in prop.get("anyOf", []) if o.get("type") not in (None, "null")]
    return " or ".join(options) or "any"


def tool_variables(tool: ToolDescription) -> dict[str, Any]:
    """One tool as the templates see it: parameters with their types, an example call, returns, when."""
    schema = tool.openai_schema()["function"].get("parameters", {})
    required = set(schema.get("required", []))
    params, example = [], {}
    for name, prop in schema.get("properties", {}).items():
        kind = _param_type(prop)
        params.append({"name": name, "type": kind, "required": name in required,
                       "description": str(prop.get("description", ""))})
        if name in required or prop.get("examples"):
            example[name] = (prop.get("examples") or [_EXAMPLE_BY_TYPE.get(kind, "...")])[0]
    return {"name": tool.name, "description": tool.description, "parameters": params,
            "example": json.dumps(example, ensure_ascii=False), "returns": tool.returns, "when": tool.when}


def prompt_variables(mode: Mode, tools: Sequence[ToolDescription], context: PromptContext) -> dict[str, Any]:
    """Every variable a system template may use (an operator's template that names another fails)."""
    return {
        "mode": mode.value,
        "agent_name": context.agent_name,
        "date": context.date,
        "max_steps": context.max_steps,
        "max_retries": context.max_retries,
        "repeat_limit": context.repeat_limit,
        "tools": [tool_variables(t) for t in tools],
        "tool_names": [t.name for t in tools],
        "plan_instructions": context.plan_instructions.strip(),
        "run_instructions": context.run_instructions.strip(),
    }


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A cheap, offline estimate (~4 characters a token) used only for the context budget."""
    return sum(4 + len(json.dumps(m, ensure_ascii=False)) // 4 for m in messages)


def system_message(mode: Mode, tools: Sequence[ToolDescription], template: SystemTemplate,
                   context: PromptContext) -> Message:
    content = template.render(prompt_variables(mode, tools, context)).strip()
    return {"role": "system", "content": content}


def question_message(mode: Mode, question: str) -> Message:
    return {"role": "user", "content": question if mode == Mode.TOOLS else f"Question: {question}"}


def _args_json(call: ToolCall) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments, ensure_ascii=False)


def reflection_due(steps: Sequence[Step], reflect_every: int) -> bool:
    """Whether the next turn asks the model to reflect: after every `reflect_every` acting steps,
    never twice in a row."""
    if not reflect_every or not steps or steps[-1].reflection:
        return False
    return sum(1 for s in steps if not s.reflection) % reflect_every == 0


def step_messages(mode: Mode, step: Step) -> list[Message]:
    """The messages one recorded step contributes to the conversation."""
    if step.reflection:
        return [{"role": "user", "content": REFLECTION}, {"role": "assistant", "content": step.thought or ""}]
    if step.error is not None:
        return [
            {"role": "assistant", "content": step.raw_output or ""},
            {"role": "user", "content": f"Observation: {step.error}" if mode == Mode.TEXT else step.error},
        ]
    if mode == Mode.TOOLS:
        assistant: Message = {
            "role": "assistant",
            "content": step.thought,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _args_json(c)}}
                for c in step.tool_calls
            ],
        }
        tools = [{"role": "tool", "tool_call_id": o.call_id, "content": o.content} for o in step.observations]
        return [assistant, *tools]
    call = step.tool_calls[0]
    text = f"Thought: {step.thought or ''}\nAction: {call.name}\nAction Input: {_args_json(call)}"
    observation = "\n".join(o.content for o in step.observations)
    return [{"role": "assistant", "content": text}, {"role": "user", "content": f"Observation: {observation}"}]


def summarize_step(step: Step, max_chars: int) -> str:
    """One line for a compacted step."""
    if step.error is not None:
        first = step.error.splitlines()[0] if step.error.strip() else ""  # "" has no first line
        line = f"step {step.index + 1}: invalid output ({first})"
    elif step.reflection:
        line = f"step {step.index + 1}: reflection: {' '.join((step.thought or '').split())}"
    else:
        parts = []
        for call, obs in zip(step.tool_calls, step.observations, strict=False):
            result = " ".join(obs.content.split())
            parts.append(f"{call.name}({_args_json(call)}) -> {result}")
        line = f"step {step.index + 1}: " + "; ".join(parts)
    return line if len(line) <= max_chars else line[: max_chars - 1] + "…"


def build_messages(
    mode: Mode,
    question: str,
    steps: Sequence[Step],
    tools: Sequence[ToolDescription],
    *,
    context_budget_tokens: int,
    system_template: SystemTemplate,
    prompt: PromptContext | None = None,
    keep_recent_steps: int = 3,
    reflect_every: int = 0,
) -> tuple[list[Message], int]:
    """The conversation for the next turn, and how many older steps were compacted into a summary."""
    system = system_message(mode, tools, system_template, prompt or PromptContext())
    head = [system, question_message(mode, question)]
    tail: list[Message] = []
    if reflection_due(steps, reflect_every):
        tail = [{"role": "user", "content": REFLECTION}]

    full = head + [m for s in steps for m in step_messages(mode, s)] + tail
    if estimate_tokens(full) <= context_budget_tokens or len(steps) <= 1:
        return full, 0

    keep = min(keep_recent_steps, len(steps) - 1)
    line_chars = 300
    while True:
        older, recent = steps[: len(steps) - keep], steps[len(steps) - keep :]
        summary = {
            "role": "user",
            "content": "Summary of earlier steps (compacted to fit the context window):\n"
            + "\n".join(summarize_step(s, line_chars) for s in older),
        }
        messages = head + [summary] + [m for s in recent for m in step_messages(mode, s)] + tail
        if estimate_tokens(messages) <= context_budget_tokens:
            return messages, len(older)
        if keep > 1:
            keep -= 1
        elif line_chars > 60:
            line_chars //= 2
        else:
            return messages, len(older)  # the smallest faithful form; the provider may still refuse it
