"""From tool observations to answer text (pure).

The conventions match what reactq's tools send back: calculator -> the value
(``395``, ``6.0``); search -> ``1. <title>: <text>`` lines or ``No results for
...``; python -> stdout, and on failure lines such as ``exit code 1`` and
``stderr: ...``. A long observation may end with ``…[truncated N chars]``.
Answers come only from the observation, so a wrong observation gives a wrong
answer: the stub never knows better than its tools.
"""

from __future__ import annotations

import re

from api_stub.chinese import answer as zh_answer
from api_stub.chinese import has_cjk
from api_stub.chinese import number_answer as zh_number_answer
from api_stub.planner import Action, keywords

__all__ = ["is_error", "answer_part", "combine"]

_TRUNCATED = re.compile(r"\s*(?:…\s*\[[^\]\n]*\]|\[truncated \d+ chars\])\s*$")
_ERROR_START = re.compile(r"^\s*(?:error|exception|traceback|invalid|unknown tool|tool error|failed|"
                          r"timed out|timeout|validation error)\b", re.I)
_ERROR_ANY = re.compile(r"\b\w*(?:Error|Exception)\b|^exit code\s*-?[1-9]\d*\s*$|^timed out", re.M)
_SEARCH_LINE = re.compile(r"^\s*\d+\.\s*([^:\n]{1,200}):\s+(.*)$")
# What reactq's python tool says for a program that printed nothing (a hint to the model, not its output)
_NO_OUTPUT = re.compile(r"^\(no output\b.*\)$", re.I)
PRINTED_NOTHING = "The program printed nothing."


def clean(observation: str) -> str:
    """The observation without a trailing truncation marker or surrounding blanks."""
    text, previous = (observation or "").strip(), None
    while text != previous:  # the sandbox and the engine may each add a marker
        text, previous = _TRUNCATED.sub("", text).strip(), text
    return text


def is_error(tool: str | None, observation: str) -> bool:
    """Whether an observation reports a failure rather than a result."""
    text = clean(observation)
    if not text or _ERROR_START.search(text):
        return True
    if tool == "python":
        return bool(_ERROR_ANY.search(text))
    if tool == "calculator":
        return bool(re.search(r"error|exception|not allowed|unsupported|invalid", text, re.I))
    return False


def error_line(observation: str) -> str:
    """The most telling line of a failure (the last one naming an error, else the last line)."""
    lines = [line.strip() for line in clean(observation).splitlines() if line.strip()]
    if not lines:
        return "no output"
    for line in reversed(lines):
        if re.search(r"error|exception|timed out", line, re.I) and not re.match(r"^stderr:\s*$", line):
            return line.removeprefix("stderr:").strip() or line
    return lines[-1]


def _python_value(observation: str) -> str:
    lines = [line.strip() for line in clean(observation).splitlines()]
    useful = [line for line in lines
              if line and not re.match(r"^(?:exit code\s*0|stdout:|stderr:)\s*$", line, re.I)
              and not _NO_OUTPUT.match(line)]
    if not useful:
        return ""
    return useful[-1].removeprefix("stdout:").strip()


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", text) if s.strip()]


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def best_sentence(question: str, observation: str) -> str | None:
    """The observation sentence sharing most keywords with the question (earlier wins ties)."""
    wanted = {_stem(w) for w in keywords(question)}
    best: tuple[float, str] | None = None
    for raw in clean(observation).splitlines():
        match = _SEARCH_LINE.match(raw)
        title, text = (match[1], match[2]) if match else ("", raw.strip())
        title_words = {_stem(w) for w in keywords(title)}
        for sentence in _sentences(text):
            words = {_stem(w) for w in keywords(sentence)}
            score = len(wanted & words) + 0.5 * len(wanted & title_words)
            if best is None or score > best[0]:
                best = (score, sentence)
    return best[1] if best else None


def answer_part(action: Action, observation: str) -> str:
    """The answer to one question part given its tool's observation."""
    text = clean(observation)
    zh = has_cjk(action.part)
    if action.tool == "search":
        if not text or re.match(r"^\s*no results\b", text, re.I) or _ERROR_START.search(text):
            detail = f" ({error_line(text)})" if _ERROR_START.search(text) else ""
            if zh:
                return f"我在搜索结果中没有找到“{action.part}”的答案{detail}。"
            return f"I could not find an answer to '{action.part}' in the search results{detail}."
        if zh:
            return zh_answer(action.part, text) or text
        return best_sentence(action.part, text) or text
    if is_error(action.tool, observation):
        return f"I could not compute it: {error_line(observation)}"
    if action.tool == "python":
        return _python_value(observation) or PRINTED_NOTHING
    value = text.splitlines()[0].strip() if text else text
    return zh_number_answer(action.part, value) if zh and value else value


def combine(actions: list[Action], answers: list[str]) -> str:
    """One final answer from the answers of all parts, in question order. Programs that printed nothing (a
    session's cells that only define names) are left out when another part has something to say."""
    parts = [(action, answer) for action, answer in zip(actions, answers, strict=True)
             if not (action.tool == "python" and answer == PRINTED_NOTHING)] or [(actions[-1], answers[-1])]
    if len(parts) == 1:
        return parts[0][1]
    pieces = []
    for action, answer in parts:
        if action.tool == "calculator" and not answer.startswith("I could not"):
            pieces.append(f"{action.argument} = {answer}")
        else:
            pieces.append(answer)
    return "; ".join(pieces)
