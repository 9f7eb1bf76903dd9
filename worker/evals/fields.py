"""Scoring a structured answer (pure): the run's `output` object against an expected object, field by field.

Each field of the expected object (nested objects flattened into dotted names: `address.city`) scores 1.0
or 0.0: numbers equal as numbers (`395` and `395.0`), strings equal once normalised (case, blanks and
punctuation aside, as the `normalised` match), lists equal item by item, booleans and null exactly; a field
the output lacks scores 0.0. Fields the output has and the expected object does not are not scored. The
line's `score` is the mean of its fields; it is `correct` when every field scores 1.0."""

from __future__ import annotations

import json
from typing import Any

from .scoring import MatchMode, matches

MAX_FIELDS = 1000  # scored per line: an expected object is the dataset's, but bounded all the same


def field_scores(output: Any, expected: dict[str, Any]) -> dict[str, float]:
    """Each expected field's score (dotted names for nested fields), in the expected object's order."""
    scores: dict[str, float] = {}
    _score(output, expected, "", scores)
    return scores


def _score(output: Any, expected: dict[str, Any], prefix: str, scores: dict[str, float]) -> None:
    for name, want in expected.items():
        if len(scores) >= MAX_FIELDS:
            return
        path = f"{prefix}{name}"
        got = output.get(name, _MISSING) if isinstance(output, dict) else _MISSING
        if isinstance(want, dict) and want:
            _score(got if isinstance(got, dict) else {}, want, f"{path}.", scores)
        else:
            scores[path] = 1.0 if got is not _MISSING and same_value(got, want) else 0.0


_MISSING = object()


def same_value(got: Any, want: Any) -> bool:
    """Whether one output value is the expected one (see the module's rules)."""
    if isinstance(want, bool) or want is None or isinstance(got, bool):
        return got is want  # True, False and None are singletons: no 1 == True, no 0 == False
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            same_value(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict):
        return isinstance(got, dict) and all(v == 1.0 for v in field_scores(got, want).values())
    if isinstance(got, dict | list) or got is None:
        return False
    return matches(str(got), str(want), MatchMode.NORMALISED)


def object_score(scores: dict[str, float]) -> float:
    """The line's score: the mean of its fields' (1.0 for an empty expected object: nothing to miss)."""
    return round(sum(scores.values()) / len(scores), 4) if scores else 1.0


def answer_object(answer: str | None) -> Any:
    """A results line's answer read back as JSON (a line written without `output`), or None."""
    if answer is None:
        return None
    try:
        return json.loads(answer)
    except ValueError:
        return None
