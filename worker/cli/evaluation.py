"""Running an evaluation set through the normal batch path (resumable, progress bar) and scoring each
result as it is written. The I/O side of `reactq eval` and `reactq demo`.

Memory stays flat in the set's size: the dataset's expected answers go to an on-disk table as the lines
are read (`EvalTable`), each finished run is scored by one lookup there, and the summary is built from
the results file read back into that table, one line at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from ..core.models import Run
from ..evals.scoring import MatchMode
from ..evals.summary import Summary, summarise
from ..evals.table import NEW, EvalTable, Expected, rescored
from ..runtime.context import Runtime
from ..service.batch_input import ParsedLine

__all__ = ["EvalRun", "bundled_set_path", "run_eval", "scored_line"]


def bundled_set_path(name: str = "eval_set.jsonl") -> Path:
    """An evaluation set shipped with reactq (the demo runs eval_set.jsonl, then structured_set.jsonl)."""
    return Path(str(resources.files("worker").joinpath(f"data/{name}")))


def scored_line(run: Run, expected: Expected | None, category: str | None = None) -> dict[str, Any]:
    """A batch output line plus the question, its category, what was expected, whether it matched, and
    the latency."""
    latency = None if run.finished_at is None else round(run.finished_at - run.created_at, 3)
    line = {**run.result_line(), "question": run.spec.question, "category": category, "expected": None,
            "match": MatchMode.CONTAINS.value, "correct": False, "latency_s": latency}
    return rescored(line, expected)


@dataclass(frozen=True)
class EvalRun:
    code: int  # the batch's exit code
    table: EvalTable  # the dataset and the scored results (`table.lines()`: in dataset order)
    questions: int  # good dataset lines
    summary: Summary  # of every dataset question's result


def run_eval(rt: Runtime, dataset: Path, outfile: Path, send_step: Callable[[str, int], None], console: Console,
             table: EvalTable, tenant: str | None = None, tier: str | None = None, fresh: bool = False) -> EvalRun:
    """Run the set through the batch path, scoring each run as it finishes, then summarise the whole
    results file (lines written by an earlier, interrupted invocation included)."""
    from .batch_progress import run_batch_file

    def seen(line: ParsedLine) -> None:
        table.add_question(line.spec.client_id or "", line.expected, line.category)

    def line_for(run: Run) -> dict[str, Any]:
        _, expected, category = table.question(run.spec.client_id or "")
        return scored_line(run, expected, category)

    code = run_batch_file(rt, dataset, outfile, tenant, tier, send_step, console, line_for=line_for, on_line=seen,
                          fresh=fresh)
    if table.questions and not table.scorable:
        console.print("[yellow]warning:[/yellow] no line has `expected`; nothing can be scored")
    if outfile.exists():
        table.load_results(NEW, outfile)
    return EvalRun(code, table, table.questions, summarise(table.lines(NEW)))
