"""Where two runs diverge (pure): their steps compared side by side (`reactq trace --diff A B`).

Two steps are the same when the model asked for the same tool calls (name and arguments; call ids are
ignored) and got the same observations, error and final answer. Thoughts and raw output are shown but do
not count: the same decision worded differently is not a divergence."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from itertools import zip_longest
from typing import Any

from .models import Run, Step

__all__ = ["StepPair", "TraceDiff", "diff_traces", "step_summary"]


def _calls(step: Step) -> list[tuple[str, str]]:
    return [(c.name, c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments, sort_keys=True))
            for c in step.tool_calls]


def _key(step: Step) -> tuple[Any, ...]:
    return (_calls(step), [o.content for o in step.observations], step.error, step.final_answer)


def step_summary(step: Step | None) -> str:
    if step is None:
        return "—"
    if step.final_answer is not None:
        return f"final answer: {step.final_answer}"
    if step.error:
        return f"error: {step.error}"
    parts = [f"{call[0]}({call[1]}) -> {obs.content[:80]!r}"
             for call, obs in zip_longest(_calls(step), step.observations, fillvalue=None)
             if call is not None and obs is not None]
    return "; ".join(parts) or "(nothing)"


@dataclass(frozen=True)
class StepPair:
    number: int  # from 1
    same: bool
    a: str
    b: str


@dataclass(frozen=True)
class TraceDiff:
    a: str
    b: str
    diverges_at: int | None  # the first step number that differs; None when the traces are the same
    steps: list[StepPair]
    answers: tuple[str | None, str | None]
    statuses: tuple[str, str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def diff_traces(run_a: Run, steps_a: list[Step], run_b: Run, steps_b: list[Step]) -> TraceDiff:
    pairs = []
    first: int | None = None
    for number, (a, b) in enumerate(zip_longest(steps_a, steps_b), 1):
        same = a is not None and b is not None and _key(a) == _key(b)
        if not same and first is None:
            first = number
        pairs.append(StepPair(number, same, step_summary(a), step_summary(b)))
    return TraceDiff(run_a.id, run_b.id, first, pairs, (run_a.answer, run_b.answer),
                     (run_a.status.value, run_b.status.value))
