"""Turn a model's reply into a `ParsedTurn`: a thought plus tool calls, a final answer, or an error.

Pure (standard library, pydantic, `worker.core.models`; no I/O), never raises, linear in the input:
every regex is anchored at a line start with bounded quantifiers.

Text mode (`parse_text`), the classic ReAct format: `Thought:` / `Action: <tool>` / `Action Input:
<JSON>` / `Final Answer:`. Labels count only at a line start: any case, extra spaces, numbered
(`Action Input 2:`), markdown (`**Action:**`, `- Thought:`, `### Final Answer:`), `:` or `：`,
`_` for a space, the ReAct-paper `Act`/`Obs`, `Action_Params:` (the first seed article) for `Action
Input:`, and 思考 / 行动 / 动作 / 行动输入 / 动作输入 / 输入 / 观察 / 最终答案. A label's text runs to the
next label line; `\r\n` and `\r` end lines. The rules, in order:

1. None, empty or whitespace -> "empty"; no label at all (prose, binary junk) -> "garbage". A last line
   that is the start of a stop sequence (`Obs`, `Observ`, `Observation` without colon, `观`, `观察`: the
   reply was cut inside it) is dropped ("partial_stop_sequence").
2. The first Observation after an Action or Final Answer is the model's invention: it and all
   after it are cut off ("hallucinated_observation"). An Observation before any Action is ignored.
3. Whichever of Action / Final Answer comes first wins: an Action followed by a Final Answer is
   executed and the answer (written without the observation) ignored; a Final Answer followed by
   an Action is the answer. Both warn "action_and_final_answer". Only the first Action is
   executed ("multiple_actions"). Neither present (a Thought alone) -> "no_action".
4. The thought is the last Thought before that label, else the text before the first label
   (chatter before a `Thought:` is dropped). A Final Answer keeps all its lines, trimmed; an
   empty one -> "empty_final_answer".
5. `Action: Name[arg]` (ReAct paper) is a call with the string `arg` ("bracket_action"), without one
   pair of surrounding quotes ("", '', “”, 「」; `Calculator["2024 - 1982"]`), or a JSON object arg as
   the arguments; `Finish[answer]` is the final answer; text after the `]` -> "text_after_bracket".
   `{"action": ..., "action_input": ...}` (LangChain) is read too ("json_action"). Otherwise the line
   is the tool name, with quotes, backticks, `*` and trailing punctuation dropped and cut at a `(` or
   ` - ` (a copied listing line `search(query: str) - ...`); no name -> "missing_action_name". A name
   that means no tool (`None`, `N/A`, 无) -> "no_tool": the model should give a Final Answer.
6. The Action Input is the first one after the Action and before any other Action / Final
   Answer. Code fences and backticks are removed; text after a closing fence or a complete JSON
   value is dropped ("trailing_text"). JSON object -> dict; JSON string -> str; a Python dict
   literal (single quotes) -> dict via `ast.literal_eval` ("python_literal_input"); anything
   else starting with `{` -> "invalid_action_input"; other text (plain words, numbers, lists,
   code) -> that text as str, outer quotes stripped. A str input warns "plain_string_input".
   `Action Input:` with nothing after it -> `{}` (a tool without arguments; the tool's argument
   validation reports anything missing). No Action Input line -> "missing_action_input", unless
   the Action line goes on with a JSON object or a code fence ("unlabelled_action_input") or is a
   call with one quoted string, `search("x")` ("call_syntax_action").
   The one call of a text turn has id "text-0".

Format errors say what to write with a call of an offered tool (`FormatExample`: the first offered tool
and plausible arguments from its schema, prompts.format_example), never with placeholders such as
`Action: <tool name>`, which small models copy back. A copied placeholder is itself an error
("placeholder"): an Action Input like `<JSON arguments>`, a Final Answer like `<answer>` or the prompt's
"the final answer to the question"; a `<…>` tool name is left to the engine, which knows the offered tools.

Native function calling (`parse_tool_reply`): string arguments are decoded as JSON ("" is `{}`);
one that is not a JSON object stays the raw string, for the engine to turn into that call's
observation, with warning "invalid_tool_arguments" (not an error of the turn). Content beside
tool calls is the thought. Without tool calls, content that is a tool call written as text
(`text_tool_calls`: JSON with `name` and `arguments`/`parameters`, bare or fenced, or inside
`<tool_call>`, `<tools>`, `<|python_tag|>`, `[TOOL_CALLS]`; small models served without native tool
calls write these) is that call, warning "text_tool_call" (the engine runs it only if it names an offered
tool with valid arguments, else it is a format error); unreadable content inside call tags ->
"invalid_text_call". Otherwise the content is the final answer (a `Final Answer:` label is stripped and
text before it is the thought; a label before any call tag wins); no content -> "empty". In text mode a
reply without an Action or Final Answer label is read the same way, and its first call runs.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from .models import ToolCall

__all__ = ["PARSE_ERROR_KINDS", "PARSE_WARNINGS", "TEXT_STOP_SEQUENCES", "ParsedTurn", "parse_text",
           "parse_tool_reply", "join_reasoning", "split_reasoning", "text_tool_calls", "FormatExample",
           "is_placeholder_name"]  # fmt: skip

PARSE_ERROR_KINDS: tuple[str, ...] = (
    "empty", "garbage", "no_action", "missing_action_name", "missing_action_input",
    "invalid_action_input", "empty_final_answer", "no_tool", "text_after_bracket", "invalid_text_call",
    "placeholder",
)  # fmt: skip
PARSE_WARNINGS: tuple[str, ...] = (
    "hallucinated_observation", "action_and_final_answer", "multiple_actions", "numbered_labels",
    "bracket_action", "json_action", "plain_string_input", "python_literal_input", "trailing_text",
    "unlabelled_action_input", "invalid_tool_arguments", "call_syntax_action", "partial_stop_sequence",
    "text_tool_call",
)  # fmt: skip
# The OpenAI API accepts at most four stop sequences.
TEXT_STOP_SEQUENCES: list[str] = ["\nObservation:", "\n观察:", "\n观察："]


class ParsedTurn(BaseModel):
    """One model turn, parsed: exactly one of `calls`, `final_answer`, `error` is set."""

    thought: str | None = None
    calls: list[ToolCall] = Field(default_factory=list)
    final_answer: str | None = None
    error: str | None = None  # shown to the model as the observation; says what format is expected
    error_kind: str | None = None  # one of PARSE_ERROR_KINDS, for metrics
    warnings: list[str] = Field(default_factory=list)  # labels from PARSE_WARNINGS
    reasoning: str | None = None  # a reasoning model's thinking, kept out of everything above (split_reasoning)


@dataclass(frozen=True)
class FormatExample:
    """The call a format hint shows: an offered tool and plausible arguments for it as JSON text
    (prompts.format_example builds it from the first offered tool's schema). Hints never show a
    placeholder such as `<tool name>`: small models copy the hint back word for word."""

    tool: str
    arguments: str


def _example_input(tool: str, example: FormatExample | None) -> str:
    """How to write a call's arguments, shown with the example's when it is another tool's."""
    if example is None:
        return 'e.g.\nAction Input: {"query": "capital of France"}'
    other = "" if example.tool.strip().lower() == tool.strip().lower() else f" (for {example.tool})"
    return f"e.g.{other}\nAction Input: {example.arguments}"


def _format_hint(example: FormatExample | None) -> str:
    if example is None:
        return ("Reply with a 'Thought:' line, then either an 'Action:' line with the name of a tool and an "
                "'Action Input:' line with its arguments as a JSON object, or a 'Final Answer:' line with your "
                "answer.")
    return (f"Reply like this to use a tool:\nThought: I should use {example.tool}.\nAction: {example.tool}\n"
            f"Action Input: {example.arguments}\nor, once you know the answer, with a 'Thought:' line and then "
            "'Final Answer:' followed by your answer.")


# Placeholders of format hints and prompts that a small model may copy back instead of a value
_PLACEHOLDER_INPUT = re.compile(r"<[ \t]{0,3}[\w \-]{0,30}(?:json|argument|input|param|args|value)[\w \-]{0,30}>",
                                re.IGNORECASE)
_PLACEHOLDER_ANSWER = re.compile(r"<[^<>\n]{0,30}answer[^<>\n]{0,30}>", re.IGNORECASE)
_PLACEHOLDER_ANSWERS = frozenset({
    "the final answer to the question", "(the answer, taken from the observation)", "your answer",
    "the answer", "(your answer)",
})  # fmt: skip


def is_placeholder_name(name: str) -> bool:
    """A tool name written as a placeholder: `<tool name>`, `<tool>`, any name in angle brackets."""
    name = name.strip()
    return len(name) >= 2 and name[0] == "<" and name[-1] == ">"
_LABEL = re.compile(
    r"[ \t]{0,16}(?P<pre>[*_#>\-][*_#>\- \t]{0,7})?"
    r"(?P<label>final[ \t_]{0,3}answer|action[ \t_]{0,3}(?:input|param(?:eter)?s)|action|act|thoughts?"
    r"|observations?|obs|最终答案|行动输入|行动|动作输入|动作|输入|思考|观察)"
    r"[ \t]{0,3}(?P<num>\d{1,3})?[ \t]{0,3}(?P<close>[*_]{1,3})?[ \t]{0,3}[:：]"
    r"(?P<post>[ \t]{0,3}[*_]{1,3}(?![*_]))?(?P<rest>.*)",
    re.IGNORECASE,
)
_KINDS = {
    "finalanswer": "final", "最终答案": "final", "actioninput": "input", "行动输入": "input",
    "actionparams": "input", "actionparameters": "input", "动作输入": "input", "输入": "input",
    "action": "action", "act": "action", "行动": "action", "动作": "action", "thought": "thought",
    "thoughts": "thought", "思考": "thought", "observation": "obs", "observations": "obs",
    "obs": "obs", "观察": "obs",
}  # fmt: skip
_BRACKET = re.compile(r"(?P<name>[^\W\d][\w.\-]{0,63})[ \t]{0,3}\[(?P<arg>.*)\]")
_BRACKET_TAIL = re.compile(r"(?P<name>[^\W\d][\w.\-]{0,63})[ \t]{0,3}\[(?P<arg>.*)\](?P<tail>[^\]]+)")
_CALL = re.compile(r"(?P<name>[^\W\d][\w.\-]{0,63})[ \t]{0,3}\((?P<arg>.*)\)")
_QUOTES = {'"': '"', "'": "'", "“": "”", "‘": "’", "「": "」", "『": "』", "«": "»"}
# An Action that names no tool: the model meant to answer.
_NO_TOOL = frozenset({"none", "null", "nil", "n/a", "na", "no", "nothing", "no tool", "no action", "no_tool",
                      "no-tool", "无", "没有", "不需要"})  # fmt: skip
_FENCE_LANG = re.compile(r"[A-Za-z0-9_+\-]{1,15}[ \t]*\n|json[ \t]+", re.IGNORECASE)
_NAME_STRIP = " \t*`'\""
_LITERAL_MAX = 20_000  # ast.literal_eval is slow and recursive: only for small inputs
_DECODER = json.JSONDecoder(strict=False)  # strict=False: literal newlines inside strings (code)


class _Block:
    __slots__ = ("kind", "lines")

    def __init__(self, kind: str, first: str) -> None:
        self.kind = kind
        self.lines = [first]

    @property
    def text(self) -> str:
        return "\n".join(self.lines).strip()


def _label(line: str) -> tuple[str, str, bool] | None:
    """(kind, rest of the line, numbered) if the line starts with a label."""
    m = _LABEL.match(line)
    if m is None:
        return None
    rest = m["rest"]
    if m["pre"] and "*" in m["pre"] and not (m["close"] or m["post"]):
        rest = rest.rstrip().rstrip("*")  # "**Final Answer: x**": the bold closes after the text
    return _KINDS[re.sub(r"[ \t_]", "", m["label"].lower())], rest, m["num"] is not None


def _error(
    kind: str, message: str, thought: str | None = None, warnings: list[str] | None = None
) -> ParsedTurn:
    return ParsedTurn(thought=thought, error=message, error_kind=kind, warnings=warnings or [])


def _unfence(s: str) -> tuple[str, bool]:
    """Text without a surrounding code fence or backticks, and whether text after it was dropped."""
    s = s.strip()
    if s.startswith("```"):
        body = s[3:]
        lang = _FENCE_LANG.match(body)
        if lang:
            body = body[lang.end() :]
        end = body.find("```")
        if end < 0:
            return body.strip(), False
        return body[:end].strip(), bool(body[end + 3 :].strip())
    if len(s) >= 2 and s[0] == s[-1] == "`":
        return s.strip("`").strip(), False
    return s, False


def _decode_input(raw: str, warnings: list[str]) -> dict[str, Any] | str | None:
    """An Action Input as dict or str; None if it looks like a JSON object but is not one."""
    s, trailing = _unfence(raw)
    if trailing:
        warnings.append("trailing_text")
    if not s:
        return {}
    value: Any = s
    if s[0] in '{["':
        try:
            value, end = _DECODER.raw_decode(s)
            if s[end:].strip():
                warnings.append("trailing_text")
        except (ValueError, RecursionError):
            value = s
            if s[0] in "{[" and len(s) <= _LITERAL_MAX:
                try:
                    value = ast.literal_eval(s)
                    warnings.append("python_literal_input")
                except Exception:  # noqa: BLE001 - any malformed literal just means "not a literal"
                    value = s
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return value
    if s[0] == "{":
        return None
    if not isinstance(value, str):
        value = s  # a number, list or literal: the tool gets the text as written
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    warnings.append("plain_string_input")
    return value


def _json_action(text: str, thought: str | None, warnings: list[str]) -> ParsedTurn | None:
    """The LangChain form: Action: {"action": name, "action_input": ...}, possibly fenced."""
    body, _ = _unfence(text)
    if not body.startswith("{"):
        return None
    try:
        blob = _DECODER.raw_decode(body)[0]
    except (ValueError, RecursionError):
        return None
    name = blob.get("action", blob.get("name")) if isinstance(blob, dict) else None
    if not isinstance(name, str) or not name.strip():
        return None
    args = blob.get("action_input", blob.get("arguments", blob.get("input", {})))
    warnings.append("json_action")
    if re.fullmatch(r"(?i)final[ _]?answer|finish", name.strip()):
        answer = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return ParsedTurn(thought=thought, final_answer=answer.strip(), warnings=warnings)
    if not isinstance(args, dict | str):
        args = json.dumps(args, ensure_ascii=False)
    if isinstance(args, str):
        warnings.append("plain_string_input")
    return ParsedTurn(thought=thought, calls=[ToolCall(id="text-0", name=name.strip(), arguments=args)],
                      warnings=warnings)  # fmt: skip


def _final(answer: str, thought: str | None, warnings: list[str]) -> ParsedTurn:
    if not answer:
        return _error("empty_final_answer", "Invalid format: 'Final Answer:' is empty. Write your answer on the "
                      "same line, after 'Final Answer:'.", thought, warnings)  # fmt: skip
    if answer.strip().rstrip(".").casefold() in _PLACEHOLDER_ANSWERS or _PLACEHOLDER_ANSWER.fullmatch(answer.strip()):
        return _error("placeholder", f"Invalid format: {answer.strip()[:64]!r} is a placeholder copied from the "
                      "instructions, not an answer. Write your actual answer after 'Final Answer:'.", thought,
                      warnings)  # fmt: skip
    return ParsedTurn(thought=thought, final_answer=answer, warnings=warnings)


def parse_text(text: str | None, example: FormatExample | None = None) -> ParsedTurn:
    """Parse one reply in the Thought / Action / Action Input / Final Answer text format; format errors show
    `example` (an offered tool's call) as the way to write a call."""
    hint = _format_hint(example)
    if text is None or not text.strip():
        return _error("empty", "Invalid format: your reply was empty. " + hint)
    lines = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").rstrip().split("\n")
    warnings: list[str] = []
    if len(lines) > 1 and _partial_stop(lines[-1]):
        lines.pop()
        warnings.append("partial_stop_sequence")
    preamble: list[str] = []
    blocks: list[_Block] = []
    numbered = decided = False
    for line in lines:
        found = _label(line)
        if found is None:
            (blocks[-1].lines if blocks else preamble).append(line)
            continue
        kind, rest, num = found
        if kind == "obs" and decided:
            warnings.append("hallucinated_observation")
            break
        numbered = numbered or num
        decided = decided or kind in ("action", "final")
        blocks.append(_Block(kind, rest))
    if numbered:
        warnings.append("numbered_labels")
    if not blocks or all(b.kind not in ("action", "final") for b in blocks):
        written = text_tool_calls(text, example)
        if written is not None:
            return _first_text_call(written, warnings)
    if not blocks:
        return _error("garbage", "Invalid format: no 'Action:' or 'Final Answer:' found. " + hint)

    at = next((i for i, b in enumerate(blocks) if b.kind in ("action", "final")), None)
    before = blocks[:at] if at is not None else blocks
    last_thought = next((b.text for b in reversed(before) if b.kind == "thought"), "")
    thought = last_thought or "\n".join(preamble).strip() or None
    if at is None:
        return _error("no_action", "Invalid format: no 'Action:' or 'Final Answer:' found. " + hint,
                      thought, warnings)  # fmt: skip
    decisive, later = blocks[at], blocks[at + 1 :]
    if any(b.kind != decisive.kind and b.kind in ("action", "final") for b in later):
        warnings.append("action_and_final_answer")
    if decisive.kind == "final":
        return _final(decisive.text, thought, warnings)
    if any(b.kind == "action" for b in later):
        warnings.append("multiple_actions")
    return _action(decisive, later, thought, warnings, example)


def _first_text_call(turn: ParsedTurn, warnings: list[str]) -> ParsedTurn:
    """A call written as JSON or in call tags instead of the text format: text mode runs its first call."""
    if len(turn.calls) > 1:
        warnings.append("multiple_actions")
    return turn.model_copy(update={"calls": turn.calls[:1], "warnings": warnings + turn.warnings})


def _partial_stop(line: str) -> bool:
    """A last line that is the start of a stop sequence (`Obs`, `Observ`, `Observation`, `观`, `观察`): the
    reply was cut inside it (a token limit, a provider that ends early), so it is not part of the input."""
    word = line.strip(" \t*_#").rstrip("0123456789 \t")
    return word in ("观", "观察") or (len(word) >= 3 and word[0] == "O" and "observation".startswith(word.lower()))


def _action(block: _Block, later: list[_Block], thought: str | None, warnings: list[str],
            example: FormatExample | None) -> ParsedTurn:
    content = block.text
    blob = _json_action(content, thought, warnings)
    if blob is not None:
        return blob
    first, _, extra = content.partition("\n")
    line = first.strip(_NAME_STRIP).rstrip(".;,。").strip(_NAME_STRIP)
    bracket = _BRACKET.fullmatch(line)
    if bracket:
        warnings.append("bracket_action")
        if bracket["name"].lower() == "finish":
            return _final(bracket["arg"].strip(), thought, warnings)
        if bracket["name"].lower() in _NO_TOOL:
            return _no_tool(bracket["name"], thought, warnings)
        call = ToolCall(id="text-0", name=bracket["name"], arguments=_bracket_argument(bracket["arg"]))
        return ParsedTurn(thought=thought, calls=[call], warnings=warnings)

    stop = next((i for i, b in enumerate(later) if b.kind in ("action", "final")), len(later))
    inputs = next((b for b in later[:stop] if b.kind == "input"), None)
    brace = first.find("{")
    if _clean_name(first[:brace] if brace >= 0 else first).lower() in _NO_TOOL:
        return _no_tool(_clean_name(first), thought, warnings)
    if inputs is not None:
        name, raw = first, inputs.text
    elif brace < 0 and not extra.lstrip().startswith(("{", "```")):
        return _without_input(line, extra, thought, warnings, example)
    else:
        warnings.append("unlabelled_action_input")
        name, raw = (first[:brace], content[brace:]) if brace >= 0 else (first, extra)
    name = _clean_name(name)
    if not name:
        return _no_name(thought, warnings, example)
    arguments = _decode_input(raw, warnings)
    if arguments is None:
        return _error("invalid_action_input", f"Invalid format: the Action Input for '{name[:64]}' is not "
                      "valid JSON. Write it as one JSON object with double-quoted keys and strings, "
                      + _example_input(name, example), thought, warnings)  # fmt: skip
    if isinstance(arguments, str) and _PLACEHOLDER_INPUT.fullmatch(arguments.strip()) and is_placeholder_name(name):
        return _error("placeholder", f"Invalid format: 'Action: {name[:64]}' and 'Action Input: {arguments[:64]}' "
                      "are placeholders copied from the instructions, not a tool and its arguments. "
                      + _format_hint(example), thought, warnings)  # fmt: skip
    if isinstance(arguments, str) and _PLACEHOLDER_INPUT.fullmatch(arguments.strip()):
        return _error("placeholder", f"Invalid format: {arguments.strip()[:64]!r} is a placeholder copied from the "
                      f"instructions, not the arguments for '{name[:64]}'. Write them as a JSON object, "
                      + _example_input(name, example), thought, warnings)  # fmt: skip
    return ParsedTurn(thought=thought, calls=[ToolCall(id="text-0", name=name, arguments=arguments)],
                      warnings=warnings)  # fmt: skip


def _without_input(line: str, extra: str, thought: str | None, warnings: list[str],
                   example: FormatExample | None) -> ParsedTurn:
    """An Action line with no Action Input: a `name("text")` call, or an error saying what is wrong."""
    call = _CALL.fullmatch(line)
    if call:
        argument = _unquote(call["arg"].strip())
        if argument is not None:
            warnings.append("call_syntax_action")
            return ParsedTurn(thought=thought, calls=[ToolCall(id="text-0", name=call["name"], arguments=argument)],
                              warnings=warnings)  # fmt: skip
    tail = _BRACKET_TAIL.fullmatch(line)
    if tail:
        return _error("text_after_bracket", "Invalid format: unexpected text after the closing bracket: "
                      f"{tail['tail'].strip()[:80]!r}. Put the whole argument inside the brackets, e.g.\n"
                      f"Action: {tail['name']}[{tail['arg'].strip()[:80]}]", thought, warnings)  # fmt: skip
    name = _clean_name(line)
    if not name:
        return _no_name(thought, warnings, example)
    if any(c.isspace() for c in name):
        return _error("missing_action_input", f"Invalid format: 'Action: {name[:64]}' is not a tool name. Write "
                      "one tool name on the 'Action:' line and its arguments as JSON on an 'Action Input:' "
                      "line. " + _format_hint(example), thought, warnings)  # fmt: skip
    after = " (the text after it has no 'Action Input:' label)" if extra.strip() else ""
    return _error("missing_action_input", f"Invalid format: 'Action: {name[:64]}' is not followed by an "
                  f"'Action Input:' line{after}. Give the tool's arguments as a JSON object on an 'Action "
                  "Input:' line ({} for a tool without arguments). " + _format_hint(example), thought,
                  warnings)  # fmt: skip


def _unquote(arg: str) -> str | None:
    """The text inside one pair of matching quotes ("", '', “”, 「」 ...), else None."""
    if len(arg) < 2 or _QUOTES.get(arg[0]) != arg[-1]:
        return None
    if arg[0] == '"':
        try:
            value = _DECODER.decode(arg)  # "say \"hi\"": JSON escapes
            return value if isinstance(value, str) else None
        except ValueError:
            pass
    inner = arg[1:-1]
    return None if arg[-1] in inner else inner


def _bracket_argument(arg: str) -> dict[str, Any] | str:
    """`Name[arg]`: a JSON object as arguments, a quoted string without its quotes, else the text."""
    arg = arg.strip()
    if arg.startswith("{"):
        try:
            value, end = _DECODER.raw_decode(arg)
            if isinstance(value, dict) and not arg[end:].strip():
                return value
        except (ValueError, RecursionError):
            pass
    unquoted = _unquote(arg)
    return arg if unquoted is None else unquoted


def _clean_name(name: str) -> str:
    """The tool name, cut at a copied signature or description: `search(query: str)`, `add - adds`."""
    name = name.strip().strip(_NAME_STRIP)
    for cut in ("(", "（", " - ", " — ", " – "):
        name = name.partition(cut)[0]
    return name.strip().strip(_NAME_STRIP).rstrip(".:;,。").strip(_NAME_STRIP)


def _no_tool(name: str, thought: str | None, warnings: list[str]) -> ParsedTurn:
    return _error("no_tool", f"Invalid format: 'Action: {name[:64]}' means no tool: give a Final Answer "
                  "instead: a 'Thought:' line, then 'Final Answer:' followed by your answer.", thought,
                  warnings)  # fmt: skip


def _no_name(thought: str | None, warnings: list[str], example: FormatExample | None) -> ParsedTurn:
    return _error("missing_action_name", "Invalid format: 'Action:' has no tool name. " + _format_hint(example),
                  thought, warnings)  # fmt: skip


def parse_tool_reply(content: str | None, tool_calls: list[ToolCall], example: FormatExample | None = None
                     ) -> ParsedTurn:  # fmt: skip
    """Parse one reply in native function-calling mode (`example`: the call a format error shows)."""
    text = (content or "").strip()
    if tool_calls:
        calls: list[ToolCall] = []
        warnings: list[str] = []
        for i, call in enumerate(tool_calls):
            arguments = call.arguments
            if isinstance(arguments, str):
                decoded = _decode_tool_arguments(arguments)
                if decoded is None:
                    if "invalid_tool_arguments" not in warnings:
                        warnings.append("invalid_tool_arguments")
                else:
                    arguments = decoded
            calls.append(call.model_copy(update={"id": call.id or f"call-{i}", "arguments": arguments}))
        return ParsedTurn(thought=_strip_thought_label(text), calls=calls, warnings=warnings)
    if not text:
        return _error("empty", "Your reply was empty. Call one of the tools, or reply with the final answer.")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for i, line in enumerate(lines):
        found = _label(line)
        if found is not None and found[0] == "final":
            before = "\n".join(lines[:i])
            if _CALL_TAGS.search(before) is not None:
                break  # the call tags come first: the reply is a call
            answer = "\n".join([found[1], *lines[i + 1 :]]).strip()
            return _final(answer, _strip_thought_label(before), [])
    return text_tool_calls(text, example) or ParsedTurn(final_answer=text)


# --- tool calls written as text --------------------------------------------------------------------------
_CALL_TAGS = re.compile(r"<tool_call>|<tools>|<\|python_tag\|>|\[TOOL_CALLS\]")
_TAG_ENDS = {"<tool_call>": ("</tool_call>",), "<tools>": ("</tools>",),
             "<|python_tag|>": ("<|eom_id|>", "<|eot_id|>"), "[TOOL_CALLS]": ()}  # fmt: skip
_JSON_START = re.compile(r"^[ \t]{0,16}(?:[{\[]|```)", re.MULTILINE)
_TEXT_CALL_CANDIDATES = 8  # places where a bare or fenced call may start: bounded, so linear in the input
_TEXT_CALLS_MAX = 16
_NO_CALL = object()


def text_tool_calls(text: str | None, example: FormatExample | None = None) -> ParsedTurn | None:
    """A reply whose text is a tool call, as models that do not (or cannot) use native function calling
    write one; None when it is none. The forms: a JSON object with `name` and `arguments` (or
    `parameters`; also nested as `{"function": {...}}`), or a list of them, bare or in a code fence, the
    whole reply or its end (text before it is the thought) or its start (text after it is dropped,
    "trailing_text"); or anything inside the tags `<tool_call>…</tool_call>`, `<tools>…</tools>` (Qwen,
    Hermes), `<|python_tag|>…` (Llama) or `[TOOL_CALLS]…` (Mistral), where one object, a list or several
    objects count, and anything else is an "invalid_text_call" error: the tags mean a call. The calls
    are named as written (the engine checks that they name an offered tool with valid arguments); their
    ids are "text-0", "text-1"... Prose that merely shows JSON (inside a sentence, or with text on both
    sides) is no call."""
    if text is None or not text.strip():
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    tag = _CALL_TAGS.search(text)
    if tag is not None:
        return _tagged(text, tag, example)
    for n, m in enumerate(_JSON_START.finditer(text)):
        if n >= _TEXT_CALL_CANDIDATES:
            break
        start = m.end() - (3 if m.group().endswith("```") else 1)
        body, rest = _fenced(text[start:]) if text.startswith("```", start) else _json_head(text[start:])
        if body is _NO_CALL:
            continue
        before = text[: m.start()].strip()
        if before and rest.strip():
            continue  # JSON with prose on both sides: shown, not called
        calls = _calls_from(body, require_arguments=True)
        if calls:
            warnings = ["text_tool_call"] + (["trailing_text"] if rest.strip() else [])
            return ParsedTurn(thought=_strip_thought_label(before) if before else None, calls=calls,
                              warnings=warnings)  # fmt: skip
    return None


def _json_head(s: str) -> tuple[Any, str]:
    """The JSON value at the start of `s` and the text after it, or (_NO_CALL, "")."""
    try:
        value, end = _DECODER.raw_decode(s)
    except (ValueError, RecursionError):
        return _NO_CALL, ""
    return value, s[end:]


def _fenced(s: str) -> tuple[Any, str]:
    """The JSON value that is the whole body of the code fence at the start of `s`, and the text after
    the fence, or (_NO_CALL, "")."""
    body = s[3:]
    lang = _FENCE_LANG.match(body)
    if lang:
        body = body[lang.end() :]
    end = body.find("```")
    inner, rest = (body, "") if end < 0 else (body[:end], body[end + 3 :])
    inner = inner.strip()
    if not inner.startswith(("{", "[")):
        return _NO_CALL, ""
    value, after = _json_head(inner)
    return (value, rest) if value is not _NO_CALL and not after.strip() else (_NO_CALL, "")


def _tagged(text: str, first: re.Match[str], example: FormatExample | None) -> ParsedTurn:
    """The calls inside call tags (the first at `first`); text before the first tag is the thought."""
    thought = _strip_thought_label(text[: first.start()]) if text[: first.start()].strip() else None
    values: list[Any] = []
    trailing = False
    tag: re.Match[str] | None = first
    while tag is not None:
        start = tag.end()
        following = _CALL_TAGS.search(text, start)
        stop = following.start() if following is not None else len(text)
        ends = [i for e in _TAG_ENDS[tag.group()] if (i := text.find(e, start, stop)) >= 0]
        body = text[start : min(ends)] if ends else text[start:stop]
        if ends:
            after_end = text[min(ends) : stop]
            for e in _TAG_ENDS[tag.group()]:
                after_end = after_end.replace(e, "", 1) if after_end.startswith(e) else after_end
            trailing = trailing or bool(after_end.strip())
        parsed = _json_values(body)
        if parsed is None or len(values) + len(parsed) > _TEXT_CALLS_MAX:
            return _invalid_text_call(tag.group(), thought, example)
        values.extend(parsed)
        tag = following
    calls = _calls_from(values, require_arguments=False)
    if not calls:
        return _invalid_text_call(first.group(), thought, example)
    return ParsedTurn(thought=thought, calls=calls,
                      warnings=["text_tool_call"] + (["trailing_text"] if trailing else []))  # fmt: skip


def _json_values(body: str) -> list[Any] | None:
    """The JSON values in a tag's body: one, a list (flattened), or several separated by white space or
    commas, possibly fenced; None if anything else is there."""
    s, _ = _unfence(body)
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(s) and (s[pos].isspace() or s[pos] == ","):
            pos += 1
        if pos >= len(s):
            return values or None
        if s[pos] not in "{[" or len(values) >= _TEXT_CALLS_MAX:
            return None
        try:
            value, pos = _DECODER.raw_decode(s, pos)
        except (ValueError, RecursionError):
            return None
        values.extend(value if isinstance(value, list) else [value])


def _calls_from(value: Any, *, require_arguments: bool) -> list[ToolCall]:
    """Tool calls from a decoded object or list of objects; [] unless every element is a call."""
    items = value if isinstance(value, list) else [value]
    if not items or len(items) > _TEXT_CALLS_MAX:
        return []
    calls = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return []
        if isinstance(item.get("function"), dict) and "name" in item["function"]:
            item = item["function"]  # the OpenAI shape: {"type": "function", "function": {...}}
        name = item.get("name")
        key = "arguments" if "arguments" in item else "parameters" if "parameters" in item else None
        if not isinstance(name, str) or not name.strip() or (key is None and require_arguments):
            return []
        raw = item.get(key) if key is not None else None
        arguments: dict[str, Any] | str
        if raw is None:
            arguments = {}
        elif isinstance(raw, dict):
            arguments = raw
        elif isinstance(raw, str):
            decoded = _decode_tool_arguments(raw)
            arguments = raw if decoded is None else decoded
        else:
            arguments = json.dumps(raw, ensure_ascii=False)
        calls.append(ToolCall(id=f"text-{i}", name=name.strip(), arguments=arguments))
    return calls


def _invalid_text_call(tag: str, thought: str | None, example: FormatExample | None) -> ParsedTurn:
    shape = (f', e.g. {{"name": {json.dumps(example.tool)}, "arguments": {example.arguments}}}' if example
             else "")
    return _error("invalid_text_call", f"Invalid format: the tool call after {tag} could not be read. Write the "
                  'call as one JSON object with the tool\'s "name" and its "arguments" (an object)'
                  f"{shape}, or reply with the final answer only.", thought)  # fmt: skip


_THINK = re.compile(r"<(think|thinking)>(.*?)(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE)
_THINK_END = re.compile(r"</think(?:ing)?>", re.IGNORECASE)


def split_reasoning(content: str | None) -> tuple[str | None, str | None]:
    """(reasoning, the rest) of a reply's content: `<think>…</think>` blocks (also `<thinking>`) are the
    reasoning; one left open (the reply was cut inside it) runs to the end; a `</think>` with no opening
    tag (the chat template opened it in the prompt: Qwen3, DeepSeek-R1) closes reasoning that started the
    content. Content without these tags is returned as it is."""
    if content is None or "think" not in content.lower():
        return None, content
    thoughts: list[str] = []
    first = _THINK.search(content)
    head_end = _THINK_END.search(content, 0, first.start() if first is not None else len(content))
    if head_end is not None:
        thoughts.append(content[: head_end.start()])
        content = content[head_end.end() :]
    def taken(m: re.Match[str]) -> str:
        thoughts.append(m.group(2))
        return "\n"

    rest = _THINK_END.sub("", _THINK.sub(taken, content))  # a stray closing tag is no part of the reply
    reasoning = "\n\n".join(t.strip() for t in thoughts if t.strip()) or None
    if not thoughts:
        return None, content
    return reasoning, rest.strip() or None


def join_reasoning(*parts: str | None) -> str | None:
    """Reasoning from several places (the message's field, tags in its content), in order; None if none."""
    return "\n\n".join(p.strip() for p in parts if p and p.strip()) or None


def _decode_tool_arguments(raw: str) -> dict[str, Any] | None:
    if not raw.strip():
        return {}
    try:
        value = _DECODER.decode(raw.strip())
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _strip_thought_label(text: str) -> str | None:
    found = _label(text.partition("\n")[0])
    if found is not None and found[0] == "thought":
        text = "\n".join([found[1], text.partition("\n")[2]])
    return text.strip() or None
