"""The figures of one evaluation results file (pure): success rate, turns, tokens and USD per question,
latency, failures grouped by status and reason, and the worst questions.

A results line is a batch output line plus `question`, `expected`, `match`, `correct` and `latency_s`
(what `reactq eval` writes)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Failure", "Summary", "percentile", "summarise", "tokens_of", "WRONG_ANSWER"]

WRONG_ANSWER = "wrong answer"  # the reason of a run that succeeded with an answer that does not match


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `values`; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


def summarise(lines: Sequence[dict[str, Any]], worst: int = 5) -> Summary:
    n = len(lines)
    correct = sum(bool(line.get("correct")) for line in lines)
    turns = [float(line.get("steps") or 0) for line in lines]
    tokens = [tokens_of(line) for line in lines]
    usd = [float(line.get("cost_usd") or 0.0) for line in lines]
    latency = [float(line["latency_s"]) for line in lines if line.get("latency_s") is not None]
    grouped: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        if not line.get("correct"):
            grouped.setdefault(_reason(line), []).append(str(line.get("id")))
    counts = Counter({key: len(ids) for key, ids in grouped.items()})
    failures = [Failure(status, reason, count, grouped[(status, reason)])
                for (status, reason), count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    ranked = sorted(lines, key=_badness, reverse=True)[:worst]
    return Summary(
        questions=n,
        correct=correct,
        success_rate=correct / n if n else 0.0,
        turns_mean=sum(turns) / n if n else 0.0,
        turns_p95=percentile(turns, 95),
        tokens_per_question=sum(tokens) / n if n else 0.0,
        usd_per_question=sum(usd) / n if n else 0.0,
        latency_p50_s=percentile(latency, 50),
        latency_p95_s=percentile(latency, 95),
        total_tokens=sum(tokens),
        total_usd=sum(usd),
        failures=failures,
        worst=[{k: line.get(k) for k in ("id", "question", "status", "answer", "expected", "correct", "steps")}
               | {"tokens": tokens_of(line)} for line in ranked],
    )
