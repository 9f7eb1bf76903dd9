"""The best-effort answer at a limit (pure): when a run stops at max_steps, a loop or too many invalid
outputs, one last call with tools disabled asks the model for its best answer from what it gathered
("返回当前已有的信息": return the information you already have). The runner makes the call; this module
says which ends qualify, what the call sends and how its reply reads as an answer."""

from __future__ import annotations

import re
from typing import Any

from .engine import End, Limits
from .models import LLMReply, Mode, Run, RunStatus
from .parser import parse_text, parse_tool_reply, split_reasoning

# The safeguards of `End`s that get a best-effort answer (with max_steps): the model's own loops.
LOOP_SAFEGUARDS = frozenset({"loop", "invalid_outputs", "cut_off", "repeated_thought", "no_progress",
                             "context_exceeded"})

_WHY = {
    "max_steps": "You have reached the step limit.",
    "loop": "You have repeated the same action too many times.",
    "repeated_thought": "You have repeated the same thought too many times.",
    "no_progress": "Your last actions all returned the same observation.",
    "invalid_outputs": "Your last outputs could not be read.",
    "cut_off": "Your last replies were cut off at the token limit.",
    "context_exceeded": "The conversation has grown too long for you.",
}
_ASK = "Using only the observations above, give your best Final Answer now, even if approximate."
_SHORT = " Keep it short."
_TOOLS_TAIL = " Do not call any tool: answer in plain text."
_TEXT_TAIL = " Reply with one line starting with \"Final Answer:\"."
_OBJECT_TAIL = " The answer must be the JSON object the output schema describes."  # a run with an output_schema

# Lines of the ReAct format that are not the answer, for a text reply without a Final Answer label
_FORMAT_LINE = re.compile(r"^\s*[*#>\-\s]*(thought|action(?:[ _]input)?|observation|思考|行动(?:输入)?|观察)\s*[:：]",
                          re.IGNORECASE)


def eligible(end: End) -> bool:
    """Whether a run ending with `end` asks for a best-effort answer first."""
    return end.status == RunStatus.MAX_STEPS or (end.status == RunStatus.FAILED and end.safeguard in LOOP_SAFEGUARDS)


def has_room(run: Run, now: float, limits: Limits) -> bool:
    """Whether the deadline and the run's token budget still allow the final call (a tenant's budgets
    are checked when the call is reserved)."""
    if run.deadline_at is not None and now >= run.deadline_at:
        return False
    spent = run.usage.total
    return not (limits.max_tokens_per_run and spent >= limits.max_tokens_per_run)


def instruction(end: End) -> str:
    short = _SHORT if end.safeguard == "cut_off" else ""
    return f"{_WHY.get(end.safeguard, 'You have reached a limit.')} {_ASK}{short}"


def final_request(mode: Mode, messages: list[dict[str, Any]], options: dict[str, Any],
                  end: End, structured: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and options of the final call: the conversation so far, then the instruction. In
    tools mode the tool schemas stay (the conversation names them) and `tool_choice` is "none".
    `structured`: the run has an output schema, and the answer is to be its object."""
    tail = (_TOOLS_TAIL if mode == Mode.TOOLS else _TEXT_TAIL) + (_OBJECT_TAIL if structured else "")
    messages = [*messages, {"role": "user", "content": instruction(end) + tail}]
    options = dict(options)
    if mode == Mode.TOOLS:
        options["tool_choice"] = "none"
    return messages, options


def answer_from(mode: Mode, reply: LLMReply) -> str | None:
    """The answer in the final call's reply: the Final Answer if there is one, else the reply's text
    without the ReAct format's lines (tool calls, if the model made any anyway, are ignored); None if
    nothing is left."""
    content = split_reasoning(reply.content)[1]  # a reasoning model's <think> is not the answer
    if mode == Mode.TOOLS:
        turn = parse_tool_reply(content, [])
    else:
        turn = parse_text(content)
    if turn.final_answer is not None and turn.final_answer.strip():
        return turn.final_answer.strip()
    if turn.calls and "text_tool_call" in turn.warnings:
        return None  # a tool call written as text: no answer
    kept = [line for line in (content or "").splitlines() if not _FORMAT_LINE.match(line)]
    text = "\n".join(kept).strip()
    return text or None
