"""Two evaluation results files side by side (pure): per question and in total, regressions flagged.

`base` is the earlier results file (`--compare OTHER.jsonl`), `new` the one just produced. A regression
is a question `base` answered correctly and `new` does not."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from .summary import Summary, summarise, tokens_of

__all__ = ["Change", "Comparison", "QuestionDiff", "compare"]


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


@dataclass(frozen=True)
class Comparison:
    base: Summary
    new: Summary
    rows: list[QuestionDiff]

    @property
    def regressions(self) -> list[QuestionDiff]:
        return [r for r in self.rows if r.change == Change.REGRESSION]

    @property
    def improvements(self) -> list[QuestionDiff]:
        return [r for r in self.rows if r.change == Change.IMPROVEMENT]

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base.to_json(),
            "new": self.new.to_json(),
            "regressions": [r.id for r in self.regressions],
            "improvements": [r.id for r in self.improvements],
            "questions": [asdict(r) for r in self.rows],
        }


def _change(base: dict[str, Any] | None, new: dict[str, Any] | None) -> Change:
    if base is None:
        return Change.ONLY_NEW
    if new is None:
        return Change.ONLY_BASE
    if base.get("correct") and not new.get("correct"):
        return Change.REGRESSION
    if new.get("correct") and not base.get("correct"):
        return Change.IMPROVEMENT
    return Change.SAME


def compare(new_lines: Sequence[dict[str, Any]], base_lines: Sequence[dict[str, Any]]) -> Comparison:
    base_by_id = {str(line.get("id")): line for line in base_lines}
    new_by_id = {str(line.get("id")): line for line in new_lines}
    order = list(new_by_id) + [i for i in base_by_id if i not in new_by_id]
    rows = []
    for qid in order:
        b, n = base_by_id.get(qid), new_by_id.get(qid)
        either = n or b or {}
        rows.append(QuestionDiff(
            id=qid, question=str(either.get("question") or ""), change=_change(b, n),
            base_correct=None if b is None else bool(b.get("correct")),
            new_correct=None if n is None else bool(n.get("correct")),
            base_steps=None if b is None else int(b.get("steps") or 0),
            new_steps=None if n is None else int(n.get("steps") or 0),
            base_tokens=None if b is None else tokens_of(b),
            new_tokens=None if n is None else tokens_of(n),
            base_answer=None if b is None else b.get("answer"),
            new_answer=None if n is None else n.get("answer"),
        ))
    return Comparison(base=summarise(base_lines), new=summarise(new_lines), rows=rows)
