"""Prompt building: the conversation is rebuilt from the run's steps on every turn. Pure.

The system prompt is a template per mode (worker/core/templates/*.j2, compiled once by
worker/prompt_templates.py) rendered with `prompt_variables`: the agent's name, the tools (description,
parameters, example, returns, when to use), the limits, the run's date and extra instructions. This
module never imports the template engine: it is handed a compiled template (`SystemTemplate`).

When the conversation would exceed the context budget, older steps are compacted into one summary
message (every older step keeps a line); the system prompt, the question and the latest steps stay. The
budget follows the model's context window when REACTQ_MODELS gives it (`context_budget`); a prompt the
provider refused as too large anyway can be sent again without older observations' bodies
(`drop_observation_bodies`, engine.after_context_exceeded).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from .models import Mode, Step, ToolCall
from .parser import FormatExample
from .structured import prompt_section

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
    output_schema: Mapping[str, Any] | None = None  # the run's: the system prompt ends saying how to answer


def run_date(created_at: float, override: str | None = None) -> str:
    """The date a run's prompt states: REACTQ_PROMPT_DATE if set, else the UTC day the run was created, so
    every turn of a run (and `reactq trace --prompt` later) sees the same system prompt."""
    return override or datetime.fromtimestamp(created_at, UTC).date().isoformat()


# Plausible values for a string parameter without examples, by a word in its name (first match wins): an
# example a model copies must be a value the tool could take, never a placeholder ("...", "<query>").
_STRING_BY_NAME: tuple[tuple[str, str], ...] = (
    ("expr", "2 + 3 * 4"), ("formula", "2 + 3 * 4"), ("math", "2 + 3 * 4"), ("query", "capital of France"),
    ("search", "capital of France"), ("keyword", "capital of France"), ("question", "What is the capital of France?"),
    ("code", "print(2 + 3)"), ("script", "print(2 + 3)"), ("url", "https://example.com"), ("link", "https://example.com"),
    ("email", "ada@example.com"), ("city", "Paris"), ("location", "Paris"), ("place", "Paris"),
    ("country", "France"), ("date", "2024-01-31"), ("time", "12:00"), ("lang", "en"), ("path", "notes.txt"),
    ("file", "notes.txt"), ("name", "Ada Lovelace"), ("title", "Nomadland"), ("id", "42"),
    ("text", "hello world"), ("content", "hello world"), ("message", "hello world"), ("prompt", "hello world"),
)  # fmt: skip
_STRING_BY_FORMAT = {"date": "2024-01-31", "date-time": "2024-01-31T12:00:00Z", "email": "ada@example.com",
                     "uri": "https://example.com", "url": "https://example.com", "time": "12:00:00"}
_EXAMPLE_DEPTH = 3


def _param_type(prop: Mapping[str, Any]) -> str:
    if "type" in prop:
        return str(prop["type"])
    options = [str(o.get("type")) for o in prop.get("anyOf", []) if o.get("type") not in (None, "null")]
    return " or ".join(options) or "any"


def example_value(name: str, prop: Mapping[str, Any], depth: int = 0) -> Any:
    """A plausible value for one parameter from its JSON schema: its own example, default, first enum value
    or const, else one made up from its type (and, for a string, its name or format), within its bounds."""
    for key in ("examples", "enum"):
        if isinstance(prop.get(key), list) and prop[key]:
            return prop[key][0]
    if prop.get("default") is not None:
        return prop["default"]
    if "const" in prop:
        return prop["const"]
    if "$ref" in prop:
        return {}  # a nested model: its schema is elsewhere ($defs)
    options = [o for o in prop.get("anyOf", []) if isinstance(o, Mapping) and o.get("type") not in (None, "null")]
    if "type" not in prop and options:
        return example_value(name, options[0], depth)
    kind = prop.get("type")
    kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
    if kind in ("integer", "number"):
        low = prop.get("minimum", prop.get("exclusiveMinimum"))
        value: float = 3 if low is None else low + (1 if "exclusiveMinimum" in prop and "minimum" not in prop else 0)
        high = prop.get("maximum")
        value = min(value, high) if high is not None else value
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    if kind == "array":
        items = prop.get("items")
        if isinstance(items, Mapping) and depth < _EXAMPLE_DEPTH:
            return [example_value(name, items, depth + 1)] * max(1, int(prop.get("minItems", 1)))
        return []
    if kind == "object":
        return example_arguments(prop, depth + 1) if depth < _EXAMPLE_DEPTH else {}
    text = _STRING_BY_FORMAT.get(str(prop.get("format", "")))
    if text is None:
        lowered = name.lower()
        text = next((v for word, v in _STRING_BY_NAME if word in lowered), "example")
    low, high = int(prop.get("minLength", 0)), prop.get("maxLength")
    text = text if len(text) >= low else text + "x" * (low - len(text))
    return text[: int(high)] if high is not None else text


def example_arguments(schema: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    """Plausible arguments for a JSON schema of an object: its required properties and those with examples
    (else its first property, so that an example is never empty when the tool takes something)."""
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        return {}
    required = set(schema.get("required", []))
    names = [n for n, p in props.items() if n in required or (isinstance(p, Mapping) and p.get("examples"))]
    return {n: example_value(n, props[n] if isinstance(props[n], Mapping) else {}, depth)
            for n in names or [next(iter(props))]}


def tool_variables(tool: ToolDescription) -> dict[str, Any]:
    """One tool as the templates see it: parameters with their types, an example call, returns, when."""
    schema = tool.openai_schema()["function"].get("parameters", {})
    required = set(schema.get("required", []))
    params = []
    for name, prop in schema.get("properties", {}).items():
        params.append({"name": name, "type": _param_type(prop), "required": name in required,
                       "description": str(prop.get("description", ""))})
    return {"name": tool.name, "description": tool.description, "parameters": params,
            "example": json.dumps(example_arguments(schema), ensure_ascii=False), "returns": tool.returns,
            "when": tool.when}


def format_example(tools: Sequence[ToolDescription]) -> FormatExample | None:
    """The call the format hints show (parser.FormatExample): the first offered tool with plausible arguments
    built from its schema, the same as the system prompt's example for it; None without tools."""
    if not tools:
        return None
    try:
        return _format_example(cast(Hashable, tools[0]))
    except TypeError:  # a tool that is not hashable
        return _format_example.__wrapped__(tools[0])


@functools.lru_cache(maxsize=256)
def _format_example(tool: ToolDescription) -> FormatExample:
    first = tool_variables(tool)
    return FormatExample(tool=first["name"], arguments=first["example"])


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


CONTEXT_MARGIN = 0.85  # of what is left of a model's window: the estimate above is rough (CJK, code)
MIN_CONTEXT_BUDGET = 256


def context_budget(default_tokens: int, context_tokens: int | None, reply_tokens: int,
                   tools: Sequence[ToolDescription] = ()) -> int:
    """The conversation's token budget: with the model's context window known (REACTQ_MODELS'
    `context_tokens`), the window less the reply's max_tokens and the tool schemas sent beside the
    messages (tools mode), times CONTEXT_MARGIN; else `default_tokens` (REACTQ_CONTEXT_BUDGET_TOKENS)."""
    if not context_tokens:
        return default_tokens
    schemas = estimate_tokens([t.openai_schema() for t in tools])
    return max(MIN_CONTEXT_BUDGET, int((context_tokens - reply_tokens - schemas) * CONTEXT_MARGIN))


DROPPED = "[dropped to fit the model's context window: {n} chars]"


def drop_observation_bodies(messages: Sequence[Message], keep_last: int = 1) -> tuple[list[Message], int]:
    """The conversation with the bodies of all observations but the last `keep_last` replaced by a short
    marker (tool messages in tools mode, "Observation:" user turns in text mode), and how many were
    dropped: what a step sends again after the provider refused the prompt as larger than the model's
    context (engine.after_context_exceeded). The system prompt, the question, the model's own turns, a
    summary of compacted steps and the latest observations stay."""
    def is_observation(m: Message) -> bool:
        content = m.get("content")
        return m.get("role") == "tool" or (m.get("role") == "user" and isinstance(content, str)
                                          and content.startswith("Observation: "))

    places = [i for i, m in enumerate(messages) if is_observation(m)]
    drop = set(places[: max(0, len(places) - keep_last)])
    out: list[Message] = []
    for i, m in enumerate(messages):
        if i in drop:
            content = str(m.get("content") or "")
            body = DROPPED.format(n=len(content))
            m = {**m, "content": f"Observation: {body}" if m.get("role") == "user" else body}
        out.append(m)
    return out, len(drop)


def system_message(mode: Mode, tools: Sequence[ToolDescription], template: SystemTemplate,
                   context: PromptContext) -> Message:
    """The system prompt. Every turn of every run with the same tools, template and context has the same
    one, so it is rendered once and remembered (rendering was ~3% of a step's CPU); a context with an
    output schema (a mapping, not hashable) is rendered each time."""
    try:
        content = _system_content(mode, tuple(tools), cast(Hashable, template), context)
    except TypeError:  # unhashable: an output schema, or a tool that is not hashable
        content = _system_content.__wrapped__(mode, tuple(tools), template, context)
    return {"role": "system", "content": content}


@functools.lru_cache(maxsize=256)
def _system_content(mode: Mode, tools: tuple[ToolDescription, ...], template: SystemTemplate,
                    context: PromptContext) -> str:
    content = template.render(prompt_variables(mode, tools, context)).strip()
    if context.output_schema is not None:
        content = f"{content}\n\n{prompt_section(mode, context.output_schema)}"
    return content


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
