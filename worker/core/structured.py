"""Structured final answers (pure): a run that carries an `output_schema` must end with a JSON object that
the schema validates (docs/decisions/structured-output.md). This module reads the object out of the model's
turn and says what is wrong with it; the validating itself is an `OutputCheck` passed in (built at the edge
with the jsonschema library, worker/output_schema.py), so the engine stays free of it.

In tools mode the model is offered one more tool, `final_answer`, whose parameters are the schema: calling
it is the answer. A plain-text reply that is a JSON object is taken too (some models answer so). In text
mode the Final Answer must be the JSON object, alone or in one code fence."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .models import Mode, ToolCall

FINAL_TOOL = "final_answer"
SCHEMA_ERROR_KIND = "output_invalid"  # the parse-errors metric's kind of an answer the schema refuses
MAX_PROBLEM_CHARS = 400  # a validation error as the model and the run's error show it
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.S)


class OutputCheck(Protocol):
    """A run's output schema, ready to validate answers with."""

    @property
    def schema(self) -> Mapping[str, Any]: ...

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` (the first validation error, with where it is), or None if it fits."""


@dataclass(frozen=True)
class Answered:
    """The object the model answered with, validated, and its JSON text (the run's `answer`)."""

    output: dict[str, Any]
    text: str


@dataclass(frozen=True)
class Refused:
    """An answer that is no valid object: `problem` says why (it becomes the run's error if the last)."""

    problem: str

    def observation(self, mode: Mode) -> str:
        """What the model is told: what is wrong, then how to answer."""
        how = (f"Call the {FINAL_TOOL} tool once more with arguments that fit its parameters" if mode == Mode.TOOLS
               else "Write the Final Answer again as one JSON object that fits the schema, with nothing else")
        prefix = "Invalid format: " if mode == Mode.TEXT else ""
        return f"{prefix}your final answer does not fit the required output schema: {self.problem}. {how}."


def final_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The `final_answer` tool in OpenAI's shape: its parameters are the run's schema."""
    return {"type": "function", "function": {
        "name": FINAL_TOOL, "parameters": dict(schema),
        "description": "Give your final answer: call this once you know it, with the answer as arguments."}}


def prompt_section(mode: Mode, schema: Mapping[str, Any]) -> str:
    """What the system prompt adds for a run with an output schema (after the template's text, so that an
    operator's own template keeps it)."""
    shown = json.dumps(schema, ensure_ascii=False, sort_keys=True)
    if mode == Mode.TOOLS:
        return (f"Output: when you know the answer, call the {FINAL_TOOL} tool with the answer as its arguments "
                f"(do not answer in plain text). Its arguments must fit this JSON Schema:\n{shown}")
    return ("Output: your Final Answer must be a single JSON object, with nothing before or after it, that this "
            f"JSON Schema validates:\n{shown}")


def _decode(raw: Any) -> tuple[Any, str | None]:
    if not isinstance(raw, str):
        return raw, None
    text = raw.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        return json.loads(text), None
    except ValueError:
        return None, "it is not JSON (write one JSON object)"


def read_output(raw: Any, check: OutputCheck) -> Answered | Refused:
    """Validate an answer: tool arguments (a dict, or their undecoded text) or a Final Answer's text."""
    value, problem = _decode(raw)
    if problem is None and not isinstance(value, dict):
        problem = f"it is a JSON {type(value).__name__.replace('NoneType', 'null')}, not an object"
    if problem is None:
        problem = check.problem(value)
    if problem is not None:
        return Refused(problem[:MAX_PROBLEM_CHARS])
    assert isinstance(value, dict)
    return Answered(value, json.dumps(value, ensure_ascii=False))


def final_call(calls: Sequence[ToolCall]) -> ToolCall | None:
    """The `final_answer` call among a turn's calls, if the model made one."""
    return next((c for c in calls if c.name.strip() == FINAL_TOOL), None)


def never_valid_reason(streak: int, problem: str) -> str:
    """A run's error when its model's answers never fit the schema, within the format-error budget."""
    return (f"{streak} invalid model outputs in a row; no answer fit the output schema; last validation error: "
            f"{problem}")


def call_text(calls: Sequence[ToolCall]) -> str | None:
    """A refused `final_answer` call as text, for the step's raw output: a native call has no content, and
    the model is shown its own reply before the error (prompts.step_messages)."""
    call = final_call(calls)
    if call is None:
        return None
    arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments, ensure_ascii=False)
    return f"{FINAL_TOOL}({arguments})"
