"""The stub's "model": a small deterministic ReAct agent that reads a chat and replies (pure).

`respond(messages, tools)` plays one assistant turn. With `tools` (OpenAI function
schemas) it speaks native function calling: parallel `tool_calls` first, then a
plain-text final answer once every call has an observation (`role: "tool"`).
Asked to reflect (the last message is a user turn saying "reflect"), it answers in prose, without a
tool call or a final answer, as real models do. Without `tools` it writes the classic text format, one action per turn::

    Thought: ...
    Action: calculator
    Action Input: {"expression": "17 * 23 + 4"}

and finally ``Thought: I now know the final answer\\nFinal Answer: ...``; there,
observations come back as user messages starting with ``Observation:``.

The brain never raises on odd conversations: whatever it cannot make sense of
ends in a final answer. Same messages in, same reply out (call ids included).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from api_stub.answers import answer_part, combine, is_error
from api_stub.chains import next_step, parse_chain
from api_stub.knowledge import direct_answer
from api_stub.planner import Action, plan
from api_stub.structured import FINAL_TOOL, fill, offered_schema, other_tools
from api_stub.tokens import message_text

__all__ = ["Reply", "ToolCall", "respond", "KNOWN_TOOLS", "DONT_KNOW"]

KNOWN_TOOLS = ("calculator", "search", "python")
DEFAULT_ARG = {"calculator": "expression", "search": "query", "python": "code"}
DONT_KNOW = "I'm sorry, I don't know the answer to that."
_MAX_SAME_CALL = 2


@dataclass(frozen=True)
class ToolCall:
    """One function call in OpenAI's shape (`arguments` is a JSON string)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Reply:
    """One assistant turn: text and/or tool calls, with OpenAI's finish_reason."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: Literal["stop", "tool_calls", "length"] = "stop"
    mode: Literal["tools", "text"] = "tools"


@dataclass
class _Executed:
    """A tool call seen in the history, with its observation (tool/args unknown if not shown)."""

    tool: str | None
    argument: str | None
    observation: str


@dataclass
class _Conversation:
    question: str = ""
    executed: list[_Executed] = field(default_factory=list)


# --- reading the conversation -------------------------------------------------

def _question(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user":
            text = message_text(message).strip()
            if text.startswith("Observation:"):
                continue
            for line in text.splitlines():
                if line.strip().lower().startswith("question:"):
                    return line.strip()[len("question:"):].strip()
            return text
    return ""


_ACTION = re.compile(r"^\s*Action\s*:\s*(.+?)\s*$", re.M)
_ACTION_INPUT = re.compile(r"^\s*Action Input\s*:\s*(.*)", re.M | re.S)


def _text_action(content: str) -> tuple[str, str | None] | None:
    """(tool, argument) of a text-mode Action in an assistant message, if it has one."""
    match = _ACTION.search(content)
    if not match:
        return None
    tool = match[1].strip().strip("`'\"").lower()
    found = _ACTION_INPUT.search(content, match.end())
    if not found:
        return tool, None
    raw = re.split(r"\n\s*Observation\s*:", found[1])[0].strip()
    try:
        json.loads(raw)
    except ValueError:
        return None  # an unparseable Action Input was rejected by the engine, not run
    return tool, _first_argument(raw)


def _first_argument(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except (ValueError, TypeError):
        return raw or None
    if isinstance(value, dict):
        for item in value.values():
            return item if isinstance(item, str) else json.dumps(item)
        return None
    return value if isinstance(value, str) else json.dumps(value)


_SCRATCHPAD = re.compile(r"Action\s*:\s*(.+?)\s*\nAction Input\s*:\s*(.*?)\nObservation\s*:\s*(.*?)"
                         r"(?=\n\s*(?:Thought|Action|Final Answer|Question)\s*:|\Z)", re.S)


_SUMMARY_CALL = re.compile(r"([A-Za-z_][\w-]*)\((\{.*?\})\)\s*->\s*(.*?)(?=;\s*[A-Za-z_][\w-]*\(\{|$)", re.M)


def _scratchpad(text: str) -> list[_Executed]:
    """Calls written out inside one prompt message: an Action/Observation scratchpad
    (completion-style prompts) or a compaction summary (``step 1: calculator({...}) -> 84``)."""
    # format instructions come before the question; only what follows it is the agent's own work
    tail = re.split(r"^\s*Question\s*:", text, flags=re.M | re.I)[-1]
    steps = []
    for line in re.findall(r"^\s*step \d+\s*:\s*(.*)$", tail, flags=re.M | re.I):
        for match in _SUMMARY_CALL.finditer(line):
            steps.append(_Executed(match[1].lower(), _first_argument(match[2]), match[3].strip()))
    for match in _SCRATCHPAD.finditer(tail):
        tool = match[1].strip().strip("`'\"").lower()
        if re.fullmatch(r"[a-z_][\w-]*", tool) and match[3].strip() not in ("", "...", "…"):
            steps.append(_Executed(tool, _first_argument(match[2].strip()), match[3].strip()))
    return steps


def _read(messages: Sequence[Mapping[str, Any]]) -> _Conversation:
    conv = _Conversation(question=_question(messages))
    pending: dict[str, tuple[str | None, str | None]] = {}
    order: list[str] = []
    previous: Mapping[str, Any] | None = None
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                if not isinstance(call, Mapping):
                    continue
                raw_function = call.get("function")
                function: Mapping[str, Any] = raw_function if isinstance(raw_function, Mapping) else {}
                call_id = str(call.get("id", len(order)))
                pending[call_id] = (function.get("name"), _first_argument(str(function.get("arguments", ""))))
                order.append(call_id)
        elif role in ("tool", "function"):
            answered: str | None = message.get("tool_call_id")
            if answered not in pending and order:
                answered = next((c for c in order if c in pending), None)
            tool, argument = pending.pop(answered, (message.get("name"), None)) if answered else (None, None)
            conv.executed.append(_Executed(tool, argument, message_text(message)))
        elif role == "user" and not message_text(message).lstrip().startswith("Observation:"):
            conv.executed.extend(_scratchpad(message_text(message)))
        elif role == "user":
            text = message_text(message).lstrip()
            if text.startswith("Observation:"):
                found = _text_action(message_text(previous)) if previous is not None else None
                if previous is not None and previous.get("role") == "assistant" and found is None:
                    previous = message
                    continue  # feedback on a reply that made no call, not a tool result
                tool, argument = found if found else (None, None)
                conv.executed.append(_Executed(tool, argument, text[len("Observation:"):].strip()))
        previous = message
    return conv


# --- deciding -------------------------------------------------------------------

def _match(actions: list[Action], executed: list[_Executed]) -> list[str | None]:
    """The observation of each planned action, pairing history calls by tool and argument."""
    used: set[int] = set()
    result: list[str | None] = []
    for action in actions:
        free = [i for i in range(len(executed)) if i not in used]
        chosen = next((i for i in free if executed[i].tool == action.tool
                       and executed[i].argument == action.argument), None)
        if chosen is None:
            chosen = next((i for i in free if executed[i].tool == action.tool), None)
        if chosen is None:
            chosen = next((i for i in free if executed[i].tool not in KNOWN_TOOLS), None)
        if chosen is None:
            result.append(None)
        else:
            used.add(chosen)
            result.append(executed[chosen].observation)
    return result


def _available(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> dict[str, str]:
    """Tool name -> the name of its argument, for the tools this request offers."""
    if tools:
        offered: dict[str, str] = {}
        for tool in tools:
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                continue
            name = function["name"]
            params = function.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            arg = DEFAULT_ARG.get(name, "input")
            if isinstance(props, Mapping) and props and arg not in props:
                arg = next(iter(props))
            offered[name] = arg
        return offered
    systems = [message_text(m) for m in messages if m.get("role") == "system"]
    if not systems:
        return dict(DEFAULT_ARG)
    joined = "\n".join(systems).lower()
    offered = {name: arg for name, arg in DEFAULT_ARG.items() if re.search(rf"\b{name}\b", joined)}
    for name, example in _LISTED_TOOL.findall("\n".join(systems)):
        offered.setdefault(name.lower(), _first_key(example) or "input")
    return offered


# A tool the text-mode prompt lists ("Tool: NAME" ... "Example Action Input: {...}"): its argument is the
# example's first field (a server's tool the stub has no rule for, called by "call NAME with ...").
_LISTED_TOOL = re.compile(r"^Tool: (\S+)\n(?:(?!Tool: ).*\n)*?\s*Example Action Input: (\{.*\})$", re.M)


def _first_key(example: str) -> str | None:
    try:
        value = json.loads(example)
    except ValueError:
        return None
    return next(iter(value), None) if isinstance(value, dict) else None


def _call_id(question: str, index: int, action: Action) -> str:
    digest = hashlib.sha256(f"{question}\x00{index}\x00{action.tool}\x00{action.argument}".encode())
    return "call_" + digest.hexdigest()[:24]


def _thought(action: Action) -> str:
    if action.fixes is not None:
        return (f"The calculator could not read {action.fixes!r}; I will rewrite it in its syntax as "
                f"{action.argument}.")
    if action.tool == "calculator":
        return f"I need to compute {action.argument} with the calculator."
    if action.tool == "search":
        return f"I should search for '{action.argument}' to find the answer."
    if action.in_order:
        return f"Next I run {action.part} of the given code."
    if action.tool not in KNOWN_TOOLS:
        return f"I will call {action.tool} with {action.argument!r}."
    return "I will write a short Python program to compute this."


def _final(answer: str, text_mode: bool) -> Reply:
    if text_mode:
        return Reply(content=f"Thought: I now know the final answer\nFinal Answer: {answer}",
                     finish_reason="stop", mode="text")
    return Reply(content=answer, finish_reason="stop", mode="tools")


def respond(messages: Sequence[Any], tools: Sequence[Any] | None = None, *, final_only: bool = False,
            today: dt.date | None = None) -> Reply:
    """One deterministic assistant turn for this conversation (never raises on odd input).

    `final_only` (OpenAI's `tool_choice: "none"`, or a last message asking for the Final Answer now):
    the best answer from what was observed, without a call. "This year" is the year of the date the
    prompt states (a system message's "today's date is 2025-06-01"), else of `today`, else of the clock."""
    text_mode = not tools
    try:
        usable = [m for m in messages if isinstance(m, Mapping)]
        final_only = final_only or _asked_for_final(usable)
        reply = _respond(usable, other_tools(tools), text_mode, final_only, _this_year(usable, today))
        schema = offered_schema(usable, tools)
        acting = reply.tool_calls or (text_mode and "Final Answer:" not in (reply.content or ""))
        if schema is None or acting or _asked_to_reflect(usable):
            return reply
        return _structured(reply, schema, _question(usable), final_only)
    except Exception as exc:  # noqa: BLE001 - a model answers something, whatever it is fed
        return _final(f"I could not understand the conversation ({type(exc).__name__}).", text_mode)


def _structured(reply: Reply, schema: dict[str, Any], question: str, final_only: bool) -> Reply:
    """A final answer reshaped for a request with an output schema (api_stub/structured.py): the object
    as a `final_answer` call (tools mode), or as the Final Answer's text."""
    prose = (reply.content or "").split("Final Answer:", 1)[-1].strip()
    text = json.dumps(fill(schema, prose or question), ensure_ascii=False)
    if reply.mode == "text":
        return _final(text, text_mode=True)
    if final_only:
        return _final(text, text_mode=False)
    call = ToolCall(id="call_" + hashlib.sha256(f"{question}\x00{text}".encode()).hexdigest()[:24],
                    name=FINAL_TOOL, arguments=text)
    return Reply(content=None, tool_calls=(call,), finish_reason="tool_calls", mode="tools")


_REFLECT = re.compile(r"\breflect\b", re.I)


def _asked_to_reflect(messages: list[Mapping[str, Any]]) -> bool:
    """The last turn is the user (not a tool result, not the question) asking the model to reflect."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return False
    text = message_text(messages[-1]).lstrip()
    earlier_assistant = any(m.get("role") == "assistant" for m in messages[:-1])
    return earlier_assistant and not text.startswith("Observation:") and bool(_REFLECT.search(text))


def _reflection(conv: _Conversation, pending: int, text_mode: bool) -> Reply:
    """What a real model does when asked to reflect: prose, no tool call, no final answer."""
    done = len(conv.executed)
    next_move = f"{pending} more call(s) to make" if pending else "I can answer now"
    return Reply(content=f"So far I have {done} observation(s); the approach is working and {next_move}.",
                 finish_reason="stop", mode="text" if text_mode else "tools")


_DATE = re.compile(r"(?:today|current date|date|今天|日期)[^\n\d]{0,40}((?:19|20)\d\d)-(\d\d?)-(\d\d?)", re.I)


def _this_year(messages: list[Mapping[str, Any]], today: dt.date | None) -> int:
    for message in messages:
        if message.get("role") == "system":
            found = _DATE.search(message_text(message))
            if found:
                return int(found[1])
    return (today or dt.datetime.now(dt.UTC).date()).year


_FINAL_NOW = re.compile(r"final answer\b.{0,40}\bnow\b|\bnow\b.{0,40}\bfinal answer|tools? (?:are|is) disabled",
                        re.I | re.S)


def _asked_for_final(messages: list[Mapping[str, Any]]) -> bool:
    """The last message (after at least one reply) tells the model to answer now without tools."""
    if len(messages) < 3 or messages[-1].get("role") not in ("user", "system"):
        return False
    return bool(_FINAL_NOW.search(message_text(messages[-1])[-400:]))


def _chain_reply(conv: _Conversation, offered: dict[str, str], text_mode: bool, final_only: bool,
                 year: int) -> Reply | None:
    """The next turn of a dependent question (see api_stub/chains.py), or None if it is not one."""
    chain = parse_chain(conv.question, year)
    if chain is None or not {"search", "calculator"} <= set(offered):
        return None
    step = next_step(chain, [e.observation for e in conv.executed])
    if step.tool is None:
        return _final(step.argument, text_mode)
    if final_only or len(conv.executed) > 12:
        return _final(f"I could not finish: {step.thought}", text_mode)
    arguments = json.dumps({offered[step.tool]: step.argument}, ensure_ascii=False)
    if text_mode:
        return Reply(content=f"Thought: {step.thought}\nAction: {step.tool}\nAction Input: {arguments}",
                     finish_reason="stop", mode="text")
    action = Action(step.tool, step.argument, conv.question)
    call = ToolCall(id=_call_id(conv.question, len(conv.executed), action), name=step.tool, arguments=arguments)
    return Reply(content=step.thought, tool_calls=(call,), finish_reason="tool_calls", mode="tools")


def _with_fixes(actions: list[Action], executed: list[_Executed]) -> tuple[list[Action], list[str | None]]:
    """Each action whose call failed and that has a corrected argument is replaced by the corrected call
    (with its observation, if it was made)."""
    observations = _match(actions, executed)
    failed = [i for i, (a, o) in enumerate(zip(actions, observations, strict=True))
              if o is not None and a.fallback is not None and is_error(a.tool, o)]
    if not failed:
        return actions, observations
    fixed = [replace(actions[i], argument=actions[i].fallback or "", fallback=None, fixes=actions[i].argument)
             for i in failed]
    extra = _match(actions + fixed, executed)[len(actions):]
    actions, observations = list(actions), list(observations)
    for k, i in enumerate(failed):
        actions[i], observations[i] = fixed[k], extra[k]
    return actions, observations


def _arguments(action: Action, offered: dict[str, str]) -> str:
    """The call's JSON arguments: the action's argument as the tool's one field, or, for a tool the
    stub has no rule for, a JSON object given whole ("call get-sum with {"a": 1, "b": 2}")."""
    if action.tool not in KNOWN_TOOLS and action.argument.lstrip().startswith("{"):
        try:
            given = json.loads(action.argument)
        except ValueError:
            given = None
        if isinstance(given, dict):
            return json.dumps(given, ensure_ascii=False)
    return json.dumps({offered[action.tool]: action.argument}, ensure_ascii=False)


_FORCED = re.compile(r"call ([\w-]+) with (.+)", re.I | re.S)


def _respond(messages: list[Mapping[str, Any]], tools: Sequence[Any] | None, text_mode: bool,
             final_only: bool = False, year: int = 2024) -> Reply:
    conv = _read(messages)
    offered = _available(messages, tools)
    forced = _FORCED.fullmatch(conv.question.strip())
    if not forced and not conv.executed and (known := direct_answer(conv.question)) is not None:
        return _final(known, text_mode)  # common knowledge: no tool needed
    if not forced and (chained := _chain_reply(conv, offered, text_mode, final_only, year)) is not None:
        return chained
    if forced:  # "call TOOL with ARGUMENT": that call, offered or not (tests of how the agent refuses it)
        tool = forced[1].lower()
        offered.setdefault(tool, DEFAULT_ARG.get(tool, "input"))
        actions = [Action(tool, forced[2].strip(), conv.question)]
    else:
        actions = plan(conv.question, frozenset(offered))
    if actions and _asked_to_reflect(messages):
        to_call = sum(1 for o in _match(actions, conv.executed) if o is None)
        return _reflection(conv, to_call, text_mode)
    if not actions:
        return _final(DONT_KNOW, text_mode)
    actions, observations = _with_fixes(actions, conv.executed)
    for action, observation in zip(actions, observations, strict=True):
        if observation is not None and is_error(action.tool, observation) and action.tool != "search":
            # A failed call ends the run with an honest answer rather than a retry loop.
            return _final(answer_part(action, observation), text_mode)
    pending = [(i, a) for i, a in enumerate(actions) if observations[i] is None]
    if any(a.in_order for _, a in pending):
        pending = pending[:1]
    repeats = sum(1 for e in conv.executed if pending and e.tool == pending[0][1].tool
                  and e.argument == pending[0][1].argument)
    if not pending or final_only or repeats >= _MAX_SAME_CALL or len(conv.executed) > 3 * len(actions) + 2:
        answers = [answer_part(a, o) if o is not None else "I could not find out."
                   for a, o in zip(actions, observations, strict=True)]
        return _final(combine(actions, answers), text_mode)
    if text_mode:
        index, action = pending[0]
        arg_json = _arguments(action, offered)
        content = f"Thought: {_thought(action)}\nAction: {action.tool}\nAction Input: {arg_json}"
        return Reply(content=content, finish_reason="stop", mode="text")
    calls = tuple(ToolCall(id=_call_id(conv.question, i, a), name=a.tool,
                           arguments=_arguments(a, offered))
                  for i, a in pending)
    thought = " ".join(_thought(a) for _, a in pending)
    return Reply(content=thought, tool_calls=calls, finish_reason="tool_calls", mode="tools")
