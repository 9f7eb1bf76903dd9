"""Does an answer match what was expected? (pure)

Match modes (`match` of an evaluation line; `contains` when absent):

- `exact`: the answer, stripped of surrounding blanks, equals `expected`.
- `normalised`: equal after normalising both: case, whitespace and punctuation are ignored, and numbers
  are compared as numbers (`1,229` equals `1229.0`; `[9, 5, 3, 1]` equals `9, 5, 3, 1`).
- `contains`: the normalised `expected` appears as a run of whole tokens inside the normalised answer
  (so `42` is in `the answer is 42.` but not in `420`).
- `regex`: `expected` is a Python regular expression searched in the answer (case-sensitive; use `(?i)`).
- `any_of`: `expected` is a list; the answer matches when it `contains` any of them.
- `fields`: `expected` is a JSON object, compared with the run's `output` object field by field, each
  field scored (worker/evals/fields.py); the default when `expected` is an object.

An answer is the model's text, so scoring is bounded whatever it holds: numbers are decimals kept as
digits and an exponent (`1e999999999` is never expanded into an integer), a number longer than
`MAX_NUMBER_CHARS` or with an exponent beyond nine digits is compared as its literal text, and only the
first `MAX_TOKENS` tokens of a text are compared.
"""

from __future__ import annotations

import decimal
import re
from decimal import Decimal
from enum import StrEnum
from itertools import islice

__all__ = ["MatchMode", "normalise", "matches", "check_expected"]


class MatchMode(StrEnum):
    EXACT = "exact"
    NORMALISED = "normalised"
    CONTAINS = "contains"
    REGEX = "regex"
    ANY_OF = "any_of"
    FIELDS = "fields"  # an expected object against the run's output (worker/evals/fields.py)


Token = str | Decimal
MAX_TOKENS = 20_000  # of an answer or an expected text; a longer answer is scored on its start
MAX_NUMBER_CHARS = 400  # a longer number is compared as its literal text
_MAX_EXPONENT_DIGITS = 9
_ARITHMETIC = decimal.Context(prec=34, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[])
_REL_TOL = Decimal("1e-9")  # decimals printed with float noise
_ABS_TOL = Decimal("1e-12")

# a number (thousands separators, decimals, exponent; a sign only where it cannot be a minus between two
# operands, so `5-3` and `5 - 3` read alike), or a run of letters
_TOKEN = re.compile(
    r"(?P<num>(?:(?<![\w.])[-+])?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:e[-+]?\d+)?)|(?P<word>[^\W\d_]+)",
    re.IGNORECASE,
)


def _number(literal: str) -> Token:
    text = literal.replace(",", "")
    _, _, exponent = text.lower().partition("e")
    if len(text) > MAX_NUMBER_CHARS or len(exponent.lstrip("+-")) > _MAX_EXPONENT_DIGITS:
        return "#" + text  # not a word: `#` is never part of one
    return Decimal(text)  # exact: digits and an exponent, nothing expanded


def normalise(text: str) -> list[Token]:
    """Words lowercased, numbers as exact decimals; whitespace and punctuation dropped. At most
    `MAX_TOKENS` tokens, from the start."""
    return [_number(m["num"]) if m["num"] is not None else m["word"].casefold()
            for m in islice(_TOKEN.finditer(text), MAX_TOKENS)]


def _integral(d: Decimal) -> bool:
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)  # finite: the regex reads no NaN or Infinity
    return exponent >= 0 or not any(digits[max(0, len(digits) + exponent):])


def _same(a: Token, b: Token) -> bool:
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        if a == b or (_integral(a) and _integral(b)):
            return a == b  # integers exactly, however large (factorials)
        # at 34 digits of precision, whatever the exponents: bounded work, no overflow
        difference = _ARITHMETIC.abs(_ARITHMETIC.subtract(a, b))
        scale = _ARITHMETIC.max_mag(a, b).copy_abs()
        return difference <= max(_ARITHMETIC.multiply(_REL_TOL, scale), _ABS_TOL)
    return a == b


def _equal(a: list[Token], b: list[Token]) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def _contains(haystack: list[Token], needle: list[Token]) -> bool:
    if not needle:
        return False
    first = needle[0]
    return any(_same(haystack[i], first) and _equal(haystack[i : i + len(needle)], needle)
               for i in range(len(haystack) - len(needle) + 1))


def matches(answer: str | None, expected: str | list[str], mode: MatchMode | str = MatchMode.CONTAINS) -> bool:
    """Whether `answer` matches `expected` under `mode`; no answer never matches."""
    if answer is None:
        return False
    mode = MatchMode(mode)
    if mode == MatchMode.FIELDS:
        raise ValueError("match 'fields' compares the run's output object (worker/evals/fields.py), not text")
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


def check_expected(expected: str | list[str] | dict, mode: MatchMode | str) -> str | None:
    """What is wrong with an (expected, match) pair, or None when it can be scored."""
    try:
        mode = MatchMode(mode)
    except ValueError:
        return f"unknown match {mode!r}; use one of {', '.join(m.value for m in MatchMode)}"
    if (mode == MatchMode.FIELDS) != isinstance(expected, dict):
        return "an object `expected` goes with match 'fields' (its default), and match 'fields' with an object"
    if mode == MatchMode.FIELDS:
        return None
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
