"""Running an evaluation set through the normal batch path (resumable, progress bar) and reading the
scored results back. The I/O side of `reactq eval` and `reactq demo`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from ..batch_input import ParsedLine
from ..core.models import Run
from ..runtime import Runtime
from .scoring import MatchMode, matches

__all__ = ["EvalRun", "bundled_set_path", "read_results", "rescore", "run_eval"]


def bundled_set_path() -> Path:
    """The evaluation set shipped with reactq (the demo runs it)."""
    return Path(str(resources.files("worker").joinpath("data/eval_set.jsonl")))


Expected = dict[str, tuple[str | list[str], MatchMode]]


def scored_line(run: Run, expected: Expected) -> dict[str, Any]:
    """A batch output line plus the question, what was expected, whether it matched, and the latency."""
    want, mode = expected.get(run.spec.client_id or "", (None, MatchMode.CONTAINS))
    correct = want is not None and run.status.value == "succeeded" and matches(run.answer, want, mode)
    latency = None if run.finished_at is None else round(run.finished_at - run.created_at, 3)
    return {**run.result_line(), "question": run.spec.question, "expected": want, "match": mode.value,
            "correct": correct, "latency_s": latency}


def read_results(path: Path) -> list[dict[str, Any]]:
    """The lines of a results file (unreadable lines are skipped, as `reactq batch` does on resume)."""
    lines = []
    with path.open(encoding="utf-8") as f:
        for text in f:
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict) and "id" in line:
                lines.append(line)
    return lines


def rescore(lines: list[dict[str, Any]], expected: Expected) -> list[dict[str, Any]]:
    """Score each line against the dataset's current expectations (a plain batch output file can be
    compared too); lines whose id the dataset lacks keep their own verdict."""
    out = []
    for line in lines:
        key = str(line.get("id"))
        if key in expected:
            want, mode = expected[key]
            ok = line.get("status") == "succeeded" and matches(line.get("answer"), want, mode)
            line = {**line, "expected": want, "match": mode.value, "correct": ok}
        out.append(line)
    return out


@dataclass(frozen=True)
class EvalRun:
    code: int  # the batch's exit code
    lines: list[dict[str, Any]]  # every dataset question's scored result, in dataset order
    expected: Expected  # client id -> (expected, match) of every good dataset line
    questions: int  # good dataset lines


def run_eval(rt: Runtime, dataset: Path, outfile: Path, send_step: Callable[[str, int], None], console: Console,
             tenant: str | None = None, tier: str | None = None) -> EvalRun:
    """Run the set through the batch path; the expected answers are kept in memory (one entry per line)."""
    from ..batch_cli import run_batch_file

    expected: Expected = {}
    order: list[str] = []

    def seen(line: ParsedLine) -> None:
        order.append(line.spec.client_id or "")
        if line.expected is not None:
            expected[line.spec.client_id or ""] = line.expected

    code = run_batch_file(rt, dataset, outfile, tenant, tier, send_step, console,
                          line_for=lambda run: scored_line(run, expected), on_line=seen)
    if order and not expected:
        console.print("[yellow]warning:[/yellow] no line has `expected`; nothing can be scored")
    by_id = {str(line["id"]): line for line in rescore(read_results(outfile), expected)} if outfile.exists() else {}
    return EvalRun(code, [by_id[i] for i in order if i in by_id], expected, len(order))
