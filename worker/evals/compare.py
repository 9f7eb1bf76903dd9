"""Two evaluation results files side by side (pure): per question and in total, regressions flagged.

`base` is the earlier results file (`--compare OTHER.jsonl`), `new` the one just produced. A regression
is a question `base` answered correctly and `new` does not. Regressions and improvements are also
counted per category (the new line's, else the base line's; see worker/evals/categories.py), beside the
per-category figures both summaries carry.

The per-question rows are not kept: a `Comparison` holds the two summaries, the counts, and a way to
read the pairs of lines again (`pairs()`), so 100,000 questions cost no more memory than 40. The CLI
pairs them through an on-disk table (`worker/evals/table.py`); `compare` pairs two lists in memory."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from .categories import Buckets, category_of
from .summary import Summary, summarise, tokens_of

__all__ = ["CategoryChanges", "Change", "Comparison", "Pair", "QuestionDiff", "compare", "compare_pairs"]

Line = dict[str, Any]
Pair = tuple[Line | None, Line | None]  # (base, new): one question, either side possibly missing


class Change(StrEnum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SAME = "same"
    ONLY_NEW = "only_new"
    ONLY_BASE = "only_base"


@dataclass(frozen=True)
class QuestionDiff:
    id: str
    question: str
    change: Change
    base_correct: bool | None
    new_correct: bool | None
    base_steps: int | None
    new_steps: int | None
    base_tokens: int | None
    new_tokens: int | None
    base_answer: str | None
    new_answer: str | None


def _change(base: Line | None, new: Line | None) -> Change:
    if base is None:
        return Change.ONLY_NEW
    if new is None:
        return Change.ONLY_BASE
    if base.get("correct") and not new.get("correct"):
        return Change.REGRESSION
    if new.get("correct") and not base.get("correct"):
        return Change.IMPROVEMENT
    return Change.SAME


def diff(base: Line | None, new: Line | None) -> QuestionDiff:
    either = new or base or {}
    return QuestionDiff(
        id=str(either.get("id")), question=str(either.get("question") or ""), change=_change(base, new),
        base_correct=None if base is None else bool(base.get("correct")),
        new_correct=None if new is None else bool(new.get("correct")),
        base_steps=None if base is None else int(base.get("steps") or 0),
        new_steps=None if new is None else int(new.get("steps") or 0),
        base_tokens=None if base is None else tokens_of(base),
        new_tokens=None if new is None else tokens_of(new),
        base_answer=None if base is None else base.get("answer"),
        new_answer=None if new is None else new.get("answer"),
    )


@dataclass
class CategoryChanges:
    regressions: int = 0
    improvements: int = 0


@dataclass(frozen=True)
class Comparison:
    base: Summary
    new: Summary
    regression_count: int
    improvement_count: int
    pairs: Callable[[], Iterable[Pair]]  # every question again, in new's order then base-only ones
    categories: dict[str, CategoryChanges] = field(default_factory=dict)  # per category, in order of appearance

    def rows(self) -> Iterator[QuestionDiff]:
        return (diff(base, new) for base, new in self.pairs())

    @property
    def questions(self) -> int:
        return sum(1 for _ in self.pairs())

    def regressions(self) -> Iterator[QuestionDiff]:
        return (r for r in self.rows() if r.change == Change.REGRESSION)

    def improvements(self) -> Iterator[QuestionDiff]:
        return (r for r in self.rows() if r.change == Change.IMPROVEMENT)

    def json_chunks(self) -> Iterator[str]:
        """The comparison as JSON text, piece by piece (one question at a time)."""
        def ids(rows: Iterator[QuestionDiff]) -> Iterator[str]:
            first = True
            for r in rows:
                yield ("" if first else ",") + json.dumps(r.id)
                first = False

        yield f'{{"base": {json.dumps(self.base.to_json())}, "new": {json.dumps(self.new.to_json())}, '
        yield f'"categories": {json.dumps({name: asdict(c) for name, c in self.categories.items()})}, '
        yield '"regressions": ['
        yield from ids(self.regressions())
        yield '], "improvements": ['
        yield from ids(self.improvements())
        yield '], "questions": ['
        for i, r in enumerate(self.rows()):
            yield ("," if i else "") + json.dumps(asdict(r))
        yield "]}"

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads("".join(self.json_chunks()))
        return result


def compare_pairs(pairs: Callable[[], Iterable[Pair]], base: Summary, new: Summary) -> Comparison:
    """A comparison over pairs that can be read again (one pass here to count the changes)."""
    regressions = improvements = 0
    categories: Buckets[CategoryChanges] = Buckets(CategoryChanges)
    for b, n in pairs():
        change = _change(b, n)
        counts = categories.get(category_of(n if n is not None else b or {}))
        counts.regressions += change == Change.REGRESSION
        counts.improvements += change == Change.IMPROVEMENT
        regressions += change == Change.REGRESSION
        improvements += change == Change.IMPROVEMENT
    return Comparison(base, new, regressions, improvements, pairs, dict(categories.items()))


def compare(new_lines: Sequence[Line], base_lines: Sequence[Line]) -> Comparison:
    """Two lists of lines paired by id in memory (small sets, tests)."""
    base_by_id = {str(line.get("id")): line for line in base_lines}
    new_by_id = {str(line.get("id")): line for line in new_lines}
    order = list(new_by_id) + [i for i in base_by_id if i not in new_by_id]

    def pairs() -> Iterator[Pair]:
        return ((base_by_id.get(qid), new_by_id.get(qid)) for qid in order)

    return compare_pairs(pairs, summarise(base_lines), summarise(new_lines))
