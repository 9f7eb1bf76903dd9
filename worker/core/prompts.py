"""Prompt building: the conversation is rebuilt from the run's steps on every turn. Pure.

When the conversation would exceed the context budget, older steps are compacted into one summary
message (every older step keeps a line); the system prompt, the question and the latest steps stay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from .models import Mode, Step, ToolCall

Message = dict[str, Any]

TOOLS_SYSTEM = (
    "You are a careful assistant that answers questions by reasoning step by step and calling tools. "
    "Call a tool whenever it helps: never guess a number you can compute or a fact you can look up. "
    "You may call several tools at once when the calls are independent. "
    "When you know the answer, reply with the final answer only, without calling a tool."
)

TEXT_SYSTEM = """Answer the question as well as you can. You have access to the following tools:

{tools}

Use exactly this format:

Question: the question you must answer
Thought: think about what to do next
Action: the tool to use, one of [{names}]
Action Input: the tool's arguments as a JSON object
Observation: the result of the action (written for you, never by you)
... (Thought/Action/Action Input/Observation can repeat)
Thought: I now know the final answer
Final Answer: the final answer to the question

Write one Action at a time and stop after its Action Input."""

REFLECTION = (
    "Reflect before going on: what have you learned so far, is your approach working, "
    "and what is the most useful next step?"
)


class ToolDescription(Protocol):
    @property
    def name(self) -> str: ...

    def openai_schema(self) -> dict[str, Any]: ...

    def text_signature(self) -> str: ...


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A cheap, offline estimate (~4 characters a token) used only for the context budget."""
    return sum(4 + len(json.dumps(m, ensure_ascii=False)) // 4 for m in messages)


def system_message(mode: Mode, tools: Sequence[ToolDescription]) -> Message:
    if mode == Mode.TOOLS:
        return {"role": "system", "content": TOOLS_SYSTEM}
    listing = "\n".join(t.text_signature() for t in tools)
    names = ", ".join(t.name for t in tools)
    return {"role": "system", "content": TEXT_SYSTEM.format(tools=listing, names=names)}


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
    keep_recent_steps: int = 3,
    reflect_every: int = 0,
) -> tuple[list[Message], int]:
    """The conversation for the next turn, and how many older steps were compacted into a summary."""
    head = [system_message(mode, tools), question_message(mode, question)]
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
