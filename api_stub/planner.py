"""From a question to the tool calls a sensible ReAct agent would make (pure).

A question is split into independent parts ("What is 3+4 and what is the
capital of France?"); each part becomes at most one `Action`: `python` for small
programming tasks, `calculator` for arithmetic, `search` for factual questions.
The order of the checks matters: "factorial of 20" is a python task even though
it is also arithmetic.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

from api_stub.chinese import expression as zh_expression
from api_stub.chinese import has_cjk
from api_stub.chinese import search_query as zh_search_query
from api_stub.chinese import split_parts as zh_split_parts

__all__ = ["Action", "plan", "split_parts", "to_expression", "python_code", "search_query", "keywords"]


@dataclass(frozen=True)
class Action:
    """One tool call: the tool, its single argument, and the question part it answers."""

    tool: str
    argument: str
    part: str
    fallback: str | None = None  # the corrected argument to send if this one fails (a notation fix)
    fixes: str | None = None  # the failed argument this call corrects
    in_order: bool = False  # sent only once the calls before it have returned (one per step)


_SPLIT = re.compile(r"\?\s+(?=\S)|\s*[,;]?\s+and\s+(?=(?:what|who|how|which|where|when)\b)", re.I)


def split_parts(question: str) -> list[str]:
    """Independent sub-questions, in order ("A and what is B?" -> ["A", "what is B"])."""
    parts = [p.strip(" ?.!") for p in _SPLIT.split(question.strip())]
    return [p for p in parts if p]


# --- python tasks -----------------------------------------------------------

_Q = r"""['"\u2018\u201c]([^'"\u2019\u201d]*)['"\u2019\u201d]"""


def _nums(text: str) -> list[str]:
    return re.findall(r"-?\d+(?:\.\d+)?", text)


def _prime_helper() -> str:
    return ("def is_prime(n):\n    if n < 2:\n        return False\n"
            "    return all(n % d for d in range(2, int(n ** 0.5) + 1))\n")


_PY_TASKS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (re.compile(r"sum of the first (\d+) primes?(?: numbers?)?", re.I),
     lambda m: _prime_helper() + f"primes = []\nn = 2\nwhile len(primes) < {m[1]}:\n"
               "    if is_prime(n):\n        primes.append(n)\n    n += 1\nprint(sum(primes))"),
    (re.compile(r"(\d+)(?:st|nd|rd|th) prime", re.I),
     lambda m: _prime_helper() + f"count, n = 0, 1\nwhile count < {m[1]}:\n    n += 1\n"
               "    if is_prime(n):\n        count += 1\nprint(n)"),
    (re.compile(r"(\d+)(?:st|nd|rd|th) fibonacci", re.I),
     lambda m: f"a, b = 0, 1\nfor _ in range({m[1]}):\n    a, b = b, a + b\nprint(a)"),
    (re.compile(r"letter " + r"['\"]?(\w)['\"]?" + r" (?:appears?|occurs?)[^'\"]*? in (?:the word )?" + _Q,
                re.I),
     lambda m: f"print({m[2]!r}.lower().count({m[1].lower()!r}))"),
    (re.compile(r"how many (?:times does )?(?:the letter )?['\"]?(\w)['\"]?'?s? "
                r"(?:are there |are |appear )?in " + _Q, re.I),
     lambda m: f"print({m[2]!r}.lower().count({m[1].lower()!r}))"),
    (re.compile(r"how many vowels[^'\"]*" + _Q, re.I),
     lambda m: f"print(sum(c in 'aeiou' for c in {m[1]!r}.lower()))"),
    (re.compile(r"reverse (?:of )?(?:the )?(?:string |word |text )?" + _Q, re.I),
     lambda m: f"print({m[1]!r}[::-1])"),
    (re.compile(r"(?:length of|how many characters (?:are )?in) (?:the )?(?:string |word )?" + _Q, re.I),
     lambda m: f"print(len({m[1]!r}))"),
    (re.compile(r"upper ?case (?:version of )?(?:the )?(?:string )?" + _Q, re.I),
     lambda m: f"print({m[1]!r}.upper())"),
    (re.compile(r"\bsort\b.*?((?:-?\d+(?:\.\d+)?[,\s]+(?:and\s+)?)+-?\d+(?:\.\d+)?)", re.I),
     lambda m: f"print(sorted([{', '.join(_nums(m[1]))}]"
               f"{', reverse=True' if 'descending' in m.string.lower() else ''}))"),
    (re.compile(r"(?:factorial of (\d+)|(\d+) factorial|\b(\d+)!)", re.I),
     lambda m: f"import math\nprint(math.factorial({m[1] or m[2] or m[3]}))"),
    (re.compile(r"days (?:are there )?between (\d{4}-\d{2}-\d{2}) and (\d{4}-\d{2}-\d{2})", re.I),
     lambda m: f"from datetime import date\nprint(abs((date.fromisoformat({m[2]!r}) - "
               f"date.fromisoformat({m[1]!r})).days))"),
    (re.compile(r"sum of (?:all )?(?:the )?(?:integers|numbers|whole numbers) from (\d+) to (\d+)", re.I),
     lambda m: f"print(sum(range({m[1]}, {m[2]} + 1)))"),
    # a deliberately slow task, for tests and demos of long sandbox calls
    (re.compile(r"(?:wait|sleep) (?:for )?(\d+(?:\.\d+)?) seconds?,? (?:and )?then print ['\"]?(\w+)", re.I),
     lambda m: f"import time\ntime.sleep({m[1]})\nprint({m[2]!r})"),
]


def python_code(part: str) -> str | None:
    """Code that prints the answer to a small programming task, or None if `part` is not one."""
    for pattern, build in _PY_TASKS:
        match = pattern.search(part)
        if match:
            return build(match)
    return None


# --- arithmetic --------------------------------------------------------------

_FUNCS = {"sqrt", "log", "log10", "log2", "exp", "sin", "cos", "tan", "factorial", "abs", "round",
          "pi", "e", "ceil", "floor"}
_LEAD = re.compile(r"^(?:what(?:'s| is| are| does)?|calculate|compute|evaluate|how much is|solve|"
                   r"please|can you|tell me|find)\s+", re.I)
_WORDS = [
    (r"(\d+(?:\.\d+)?)\s*%\s*of\s*(\d+(?:\.\d+)?)", r"\1 * \2 / 100"),
    (r"(\d+(?:\.\d+)?)\s*percent\s*of\s*(\d+(?:\.\d+)?)", r"\1 * \2 / 100"),
    (r"(?:the\s+)?square\s+root\s+of\s+(\d+(?:\.\d+)?)", r"sqrt(\1)"),
    (r"(?:the\s+)?cube\s+root\s+of\s+(\d+(?:\.\d+)?)", r"\1 ** (1 / 3)"),
    (r"(?:the\s+)?(?:natural\s+)?log(?:arithm)?\s+of\s+(\d+(?:\.\d+)?)", r"log(\1)"),
    (r"\s*(?:raised\s+)?to\s+the\s+power\s+of\s*", " ** "),
    (r"\s*squared\b", " ** 2"), (r"\s*cubed\b", " ** 3"),
    (r"\s*(?:multiplied\s+by|times|×)\s*", " * "), (r"(?<=\d)\s*x\s*(?=\d)", " * "),
    (r"\s*(?:divided\s+by|over|÷)\s*", " / "), (r"\s*plus\s*", " + "), (r"\s*minus\s*", " - "),
    (r"\s*(?:modulo|mod)\s*", " % "), (r"\^", " ** "), (r"(?<=\d),(?=\d{3}\b)", ""),
]
_EXPR_TOKEN = re.compile(r"\s*(\d+(?:\.\d+)?|\*\*|//|[-+*/%(),]|[a-z_][a-z0-9_]*)", re.I)


_NOTATION = re.compile(r"[×÷²³√（）＋－＊／]")
_FIX = str.maketrans({"（": "(", "）": ")", "＋": "+", "－": "-", "＊": "*", "／": "/", "×": "*", "÷": "/"})


def fix_notation(text: str) -> str:
    """Math as people write it, in Python syntax: × ÷ ² ³ √ and full-width operators."""
    text = text.translate(_FIX).replace("²", " ** 2").replace("³", " ** 3")
    return re.sub(r"√\s*(\(?[\d.]+\)?)", r"sqrt(\1)", text)


def as_written(part: str) -> str | None:
    """The expression of `part` exactly in its own notation, when that notation is not Python's
    (what a model copies from the question before the calculator tells it otherwise)."""
    text = part.strip().rstrip("?.!=？。 ")
    for _ in range(2):
        text = _LEAD.sub("", text)
    text = re.sub(r"^(?:请|帮我)?(?:计算|算一下|求)\s*[:：]?", "", text).strip()
    if not _NOTATION.search(text) or to_expression(text) is None:
        return None
    return text


def to_expression(part: str) -> str | None:
    """A Python-syntax arithmetic expression for `part`, or None if it is not arithmetic."""
    text = fix_notation(part.strip().rstrip("?.!= "))
    for _ in range(2):
        text = _LEAD.sub("", text)
    text = re.sub(r"^(?:the\s+)?(?:value|result)\s+of\s+", "", text, flags=re.I)
    text = re.sub(r"\s*(?:equal|equals)$", "", text, flags=re.I)
    for pattern, repl in _WORDS:
        text = re.sub(pattern, repl, text, flags=re.I)
    text = text.strip()
    pos, tokens = 0, []
    while pos < len(text):
        match = _EXPR_TOKEN.match(text, pos)
        if not match:
            return None
        tokens.append(match[1])
        pos = match.end()
        if pos < len(text) and not text[pos:].strip():
            break
    names = {t.lower() for t in tokens if t[0].isalpha() or t[0] == "_"}
    if not tokens or not names <= _FUNCS or not any(t[0].isdigit() for t in tokens):
        return None
    if not (names or any(t in {"+", "-", "*", "/", "//", "%", "**"} for t in tokens)):
        return None
    expression = re.sub(r"\s+", " ", text)
    try:
        ast.parse(expression, mode="eval")
    except SyntaxError:
        return None
    return expression


# --- search ------------------------------------------------------------------

_STOP = set("""a an the of in on at to for from by with about and or is are was were be been do does did
what who whom whose which when where why how many much tell me please can could you your i is it its
this that these those there their they he she his her named called known as name""".split())
_QUESTION_START = re.compile(r"^(?:what|who|whom|whose|which|when|where|why|how|name|tell me|define|"
                             r"describe|explain|list|give me)\b", re.I)


def keywords(text: str) -> list[str]:
    """Content words of `text`, lowercased, in order, without duplicates."""
    seen: list[str] = []
    for word in re.findall(r"[A-Za-z0-9][A-Za-z0-9'-]*", text):
        low = word.lower().strip("'")
        if low.endswith("'s"):
            low = low[:-2]
        if low and low not in _STOP and low not in seen:
            seen.append(low)
    return seen


def search_query(part: str) -> str | None:
    """A keyword query for a factual question, or None if `part` does not look like one."""
    if not _QUESTION_START.search(part.strip()):
        return None
    words = [w for w in re.findall(r"[A-Za-z0-9][A-Za-z0-9'-]*", part) if w.lower() in keywords(w)]
    query = " ".join(dict.fromkeys(w[:-2] if w.endswith("'s") else w for w in words))
    return query or None


def _calculation(expression: str, part: str, tools: frozenset[str]) -> Action | None:
    """A calculator call in Python syntax; first as the question writes it when its notation differs
    (× ² √ …), with the fix as the fallback the brain sends after the calculator's error."""
    written = as_written(part) or (expression if _NOTATION.search(expression) else None)
    fixed = to_expression(expression)
    if fixed is None:
        return None
    if "calculator" in tools:
        if written is not None and written != fixed:
            return Action("calculator", written, part, fallback=fixed)
        return Action("calculator", fixed, part)
    if "python" in tools:
        return Action("python", f"from math import *\nprint({fixed})", part)
    return None


def _compute_or_look_up(part: str, tools: frozenset[str], expression: str | None,
                        query: Callable[[str], str | None]) -> Action | None:
    """A calculation when the part reads as arithmetic, else a search for its keywords."""
    if expression is not None:
        return _calculation(expression, part, tools)
    keywords = query(part)
    if keywords is not None and "search" in tools:
        return Action("search", keywords, part)
    return None


def _part_action(part: str, tools: frozenset[str]) -> Action | None:
    if has_cjk(part):
        return _compute_or_look_up(part, tools, zh_expression(part), zh_search_query)
    code = python_code(part)
    if code is not None:
        return Action("python", code, part) if "python" in tools else None
    return _compute_or_look_up(part, tools, to_expression(part), search_query)


# "Run this python code: ```...```": the code is sent verbatim (tests drive the sandbox through the agent).
_CODE_BLOCK = re.compile(r"\brun (?:this|the following) python(?: code)?:?\s*```(?:python)?\n(.*?)```", re.I | re.S)


# "Run these python cells in order: ```...``` ```...```": each block verbatim, one step each (python sessions).
_CELLS = re.compile(r"\brun these python cells in order:?\s*((?:```(?:python)?\n.*?```\s*)+)", re.I | re.S)
_CELL = re.compile(r"```(?:python)?\n(.*?)```", re.S)


def plan(question: str, tools: frozenset[str]) -> list[Action]:
    """The tool calls that answer `question` with the `tools` at hand, in order (may be empty)."""
    cells = _CELLS.search(question)
    if cells is not None:
        return [Action("python", code, f"cell {n}", in_order=True)
                for n, code in enumerate(_CELL.findall(cells[1]), 1)] if "python" in tools else []
    block = _CODE_BLOCK.search(question)
    if block is not None:
        return [Action("python", block[1], "the given code")] if "python" in tools else []
    actions = []
    parts = zh_split_parts(question) if has_cjk(question) else split_parts(question)
    for part in parts:
        action = _part_action(part, tools)
        if action is not None:
            actions.append(action)
    return actions
