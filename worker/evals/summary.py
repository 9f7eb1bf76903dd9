"""The figures of one evaluation results file (pure): success rate, turns, tokens and USD per question,
latency, counts by status, failures grouped by status and reason, the worst questions, and the same
figures per category (`categories`: see worker/evals/categories.py).

A results line is a batch output line plus `question`, `expected`, `match`, `correct` and `latency_s`
(what `reactq eval` writes)."""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .categories import Buckets, category_of

__all__ = ["Failure", "Summary", "SummaryBuilder", "percentile", "summarise", "tokens_of", "WRONG_ANSWER"]

WRONG_ANSWER = "wrong answer"  # the reason of a run that succeeded with an answer that does not match


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `values`; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)  # a transient list: ~3 MB for 100,000 lines
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def tokens_of(line: dict[str, Any]) -> int:
    usage = line.get("usage") or {}
    return int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))


@dataclass(frozen=True)
class Failure:
    status: str
    reason: str
    count: int
    ids: list[str]


@dataclass(frozen=True)
class Summary:
    questions: int
    correct: int
    success_rate: float
    turns_mean: float
    turns_p95: float
    tokens_per_question: float
    usd_per_question: float
    latency_p50_s: float
    latency_p95_s: float
    total_tokens: int
    total_usd: float
    failures: list[Failure] = field(default_factory=list)
    worst: list[dict[str, Any]] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)  # runs per status, most first
    categories: dict[str, Summary] = field(default_factory=dict)  # the figures of each category's lines
    partial: int = 0  # best-effort answers given at a limit (never counted correct) ...
    partial_correct: int = 0  # ... of which matched what was expected
    # structured answers (match "fields"): each field's mean score over the lines that expected it
    field_scores: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for figures in data["categories"].values():  # a category's own: no worst lines, no nesting
            del figures["worst"], figures["categories"]
        return data


def _reason(line: dict[str, Any]) -> tuple[str, str]:
    status = str(line.get("status") or "unknown")
    if status == "succeeded":
        return status, WRONG_ANSWER
    error = str(line.get("error") or "no reason given")
    return status, error.splitlines()[0][:120] if error else "no reason given"


def _badness(line: dict[str, Any]) -> tuple[int, int, int, float]:
    """Sorts worst first: wrong before right, then more turns, more tokens, slower."""
    return (0 if line.get("correct") else 1, int(line.get("steps") or 0), tokens_of(line),
            float(line.get("latency_s") or 0.0))


FAILURE_IDS = 10  # ids kept per failure group (the table shows a few; the results file has them all)
FAILURE_GROUPS = 100  # distinct (status, reason) groups kept; later reasons are counted under OTHER_REASONS
OTHER_REASONS = "other reasons"
CATEGORY_FAILURE_GROUPS = 10  # the same, in each category's figures
MAX_FIELDS = 100  # structured answers' fields given a mean score; later ones are not summarised
STATUS_KINDS = 20  # distinct statuses counted apart (a run has one of 9); later ones count under OTHER_STATUS
OTHER_STATUS = "other"


class SummaryBuilder:
    """The figures of a stream of results lines, with memory flat in their number: counts and sums, one
    float per line for the percentiles (4 bytes each), a bounded heap of the worst lines, and at most
    FAILURE_GROUPS failure groups of FAILURE_IDS ids each. With `by_category`, one more builder per
    category (no worst lines, CATEGORY_FAILURE_GROUPS groups), at most MAX_CATEGORIES of them."""

    def __init__(self, worst: int = 5, by_category: bool = True, groups: int = FAILURE_GROUPS) -> None:
        self._worst = worst
        self._group_limit = groups
        self._statuses: dict[str, int] = {}
        self._categories: Buckets[SummaryBuilder] | None = Buckets(_category_builder) if by_category else None
        self._heap: list[tuple[tuple[int, int, int, float], int, dict[str, Any]]] = []
        self._n = self._correct = self._tokens = self._partial = self._partial_correct = 0
        self._usd = 0.0
        self._turns = array("f")
        self._latency = array("f")
        self._groups: dict[tuple[str, str], tuple[int, list[str]]] = {}
        self._fields: dict[str, tuple[float, int]] = {}  # field -> (sum of scores, lines), MAX_FIELDS of them

    def add(self, line: dict[str, Any]) -> None:
        self._n += 1
        self._correct += bool(line.get("correct"))
        self._count_status(line)
        if self._categories is not None:
            self._categories.get(category_of(line)).add(line)
        self._partial += bool(line.get("partial"))
        self._partial_correct += bool(line.get("partial") and line.get("partial_correct"))
        self._turns.append(float(line.get("steps") or 0))
        self._tokens += tokens_of(line)
        self._usd += float(line.get("cost_usd") or 0.0)
        if line.get("latency_s") is not None:
            self._latency.append(float(line["latency_s"]))
        for name, score in (line.get("field_scores") or {}).items():
            if name in self._fields or len(self._fields) < MAX_FIELDS:
                total, count = self._fields.get(name, (0.0, 0))
                self._fields[name] = (total + float(score), count + 1)
        if not line.get("correct"):
            key = _reason(line)
            if key not in self._groups and len(self._groups) >= self._group_limit:
                key = (key[0], OTHER_REASONS)
            count, ids = self._groups.get(key, (0, []))
            if len(ids) < FAILURE_IDS:
                ids.append(str(line.get("id")))
            self._groups[key] = (count + 1, ids)
        if self._worst > 0:
            # the sequence number breaks ties for the earlier line, as a stable sort would
            item = (_badness(line), -self._n, {k: line.get(k) for k in _WORST_FIELDS} | {"tokens": tokens_of(line)})
            if len(self._heap) < self._worst:
                heapq.heappush(self._heap, item)
            elif item[:2] > self._heap[0][:2]:
                heapq.heapreplace(self._heap, item)

    def _count_status(self, line: dict[str, Any]) -> None:
        status = str(line.get("status") or "unknown")
        if status not in self._statuses and len(self._statuses) >= STATUS_KINDS:
            status = OTHER_STATUS
        self._statuses[status] = self._statuses.get(status, 0) + 1

    def build(self) -> Summary:
        n = self._n
        failures = [Failure(status, reason, count, ids) for (status, reason), (count, ids)
                    in sorted(self._groups.items(), key=lambda kv: (-kv[1][0], kv[0]))]
        worst = [entry for _, _, entry in sorted(self._heap, key=lambda item: item[:2], reverse=True)]
        return Summary(
            questions=n,
            correct=self._correct,
            success_rate=self._correct / n if n else 0.0,
            turns_mean=sum(self._turns) / n if n else 0.0,
            turns_p95=percentile(self._turns, 95),
            tokens_per_question=self._tokens / n if n else 0.0,
            usd_per_question=self._usd / n if n else 0.0,
            latency_p50_s=round(percentile(self._latency, 50), 3),
            latency_p95_s=round(percentile(self._latency, 95), 3),
            total_tokens=self._tokens,
            total_usd=self._usd,
            failures=failures,
            worst=worst,
            statuses=dict(sorted(self._statuses.items(), key=lambda kv: (-kv[1], kv[0]))),
            categories={} if self._categories is None else {name: b.build() for name, b in self._categories.items()},
            partial=self._partial,
            partial_correct=self._partial_correct,
            field_scores={name: round(total / count, 4) for name, (total, count) in self._fields.items()},
        )


def _category_builder() -> SummaryBuilder:
    return SummaryBuilder(worst=0, by_category=False, groups=CATEGORY_FAILURE_GROUPS)


_WORST_FIELDS = ("id", "question", "status", "answer", "partial", "expected", "correct", "steps")


def summarise(lines: Iterable[dict[str, Any]], worst: int = 5) -> Summary:
    """The figures of `lines` (any iterable: it is read once)."""
    builder = SummaryBuilder(worst)
    for line in lines:
        builder.add(line)
    return builder.build()
