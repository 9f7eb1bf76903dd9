"""Does an answer match what was expected? (pure)

Match modes (`match` of an evaluation line; `contains` when absent):

- `exact`: the answer, stripped of surrounding blanks, equals `expected`.
- `normalised`: equal after normalising both: case, whitespace and punctuation are ignored, and numbers
  are compared as numbers (`1,229` equals `1229.0`; `[9, 5, 3, 1]` equals `9, 5, 3, 1`).
- `contains`: the normalised `expected` appears as a run of whole tokens inside the normalised answer
  (so `42` is in `the answer is 42.` but not in `420`).
- `regex`: `expected` is a Python regular expression searched in the answer (case-sensitive; use `(?i)`).
- `any_of`: `expected` is a list; the answer matches when it `contains` any of them.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from fractions import Fraction

__all__ = ["MatchMode", "normalise", "matches", "check_expected"]


class MatchMode(StrEnum):
    EXACT = "exact"
    NORMALISED = "normalised"
    CONTAINS = "contains"
    REGEX = "regex"
    ANY_OF = "any_of"


Token = str | Fraction

# a number (thousands separators, decimals, exponent; a sign only where it cannot be a minus between two
# operands, so `5-3` and `5 - 3` read alike), or a run of letters
_TOKEN = re.compile(
    r"(?P<num>(?:(?<![\w.])[-+])?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:e[-+]?\d+)?)|(?P<word>[^\W\d_]+)",
    re.IGNORECASE,
)


def normalise(text: str) -> list[Token]:
    """Words lowercased, numbers as exact fractions; whitespace and punctuation dropped."""
    tokens: list[Token] = []
    for match in _TOKEN.finditer(text):
        if match["num"] is not None:
            tokens.append(Fraction(match["num"].replace(",", "")))
        else:
            tokens.append(match["word"].casefold())
    return tokens


def _same(a: Token, b: Token) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if a.denominator == 1 and b.denominator == 1:
            return a == b  # integers exactly, however large (factorials)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)  # decimals printed with float noise
    return a == b


def _equal(a: list[Token], b: list[Token]) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def _contains(haystack: list[Token], needle: list[Token]) -> bool:
    if not needle:
        return False
    return any(_equal(haystack[i : i + len(needle)], needle) for i in range(len(haystack) - len(needle) + 1))


def matches(answer: str | None, expected: str | list[str], mode: MatchMode | str = MatchMode.CONTAINS) -> bool:
    """Whether `answer` matches `expected` under `mode`; no answer never matches."""
    if answer is None:
        return False
    mode = MatchMode(mode)
    if mode == MatchMode.ANY_OF:
        options = [expected] if isinstance(expected, str) else expected
        return any(matches(answer, option, MatchMode.CONTAINS) for option in options)
    if not isinstance(expected, str):
        raise ValueError(f"match {mode.value!r} takes one expected string, not a list")
    if mode == MatchMode.EXACT:
        return answer.strip() == expected.strip()
    if mode == MatchMode.REGEX:
        return re.search(expected, answer) is not None
    if mode == MatchMode.NORMALISED:
        return _equal(normalise(answer), normalise(expected))
    return _contains(normalise(answer), normalise(expected))


def check_expected(expected: str | list[str], mode: MatchMode | str) -> str | None:
    """What is wrong with an (expected, match) pair, or None when it can be scored."""
    try:
        mode = MatchMode(mode)
    except ValueError:
        return f"unknown match {mode!r}; use one of {', '.join(m.value for m in MatchMode)}"
    if mode == MatchMode.ANY_OF:
        if isinstance(expected, str) or not expected or not all(isinstance(e, str) for e in expected):
            return "match 'any_of' needs `expected` as a non-empty list of strings"
        if any(not normalise(e) for e in expected):
            return "an `expected` alternative has no letters or digits"
        return None
    if not isinstance(expected, str):
        return f"match {mode.value!r} needs `expected` as one string (a list is for 'any_of')"
    if mode == MatchMode.REGEX:
        try:
            re.compile(expected)
        except re.error as exc:
            return f"`expected` is not a valid regular expression: {exc}"
    elif mode != MatchMode.EXACT and not normalise(expected):
        return "`expected` has no letters or digits to compare"
    return None
