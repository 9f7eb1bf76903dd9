"""The batch command's terminal side: progress bar and result file."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..core.models import Run, RunStatus
from ..errors import AdmissionRefused, InvalidRequest, TooLarge
from ..runtime.context import Runtime
from ..runtime.finish_hooks import batch_may_be_finished
from ..service.batch import BatchRunner, Earlier, Follower
from ..service.batch import Progress as BatchProgress
from ..service.batch_input import LineError, ParsedLine, iter_input
from .display import labelled, literal


def run_batch_file(
    rt: Runtime, infile: Path, outfile: Path, tenant: str | None, tier: str | None,
    send_step: Callable[..., None], console: Console,
    line_for: Callable[[Run], dict[str, Any]] = Run.result_line,
    on_line: Callable[[ParsedLine], None] | None = None,
    send_together: Callable[[], AbstractContextManager[Callable[..., None]]] | None = None,
    fresh: bool = False,
) -> int:
    """Returns the exit code: 0 when every line ran, 1 when some lines were rejected or some runs failed (how
    many and why is printed), 2 on nothing to do.
    `line_for` makes a finished run's output line (`reactq eval` adds its scoring); `on_line` sees each
    good input line as it is read. `fresh`: start over: empty `outfile`, adopt no run of an earlier
    invocation for it, submit every line anew."""

    try:
        items = iter_input(infile, rt.settings, tenant, tier, rt.tenants)  # refuses a file of several tenants
    except InvalidRequest as exc:
        console.print(labelled("error:", "red", exc))
        return 2

    def lines() -> Any:
        for item in items:
            if on_line is not None and isinstance(item, ParsedLine):
                on_line(item)
            yield item

    def rejected(error: LineError) -> None:
        console.print(labelled("rejected", "red", f"{infile}:{error}"))

    def waiting(refused: AdmissionRefused) -> None:
        console.print(labelled(f"waiting {refused.retry_after_s}s:", "yellow",
                               f"{refused}; the batch goes on after that"))

    runner = BatchRunner(rt.store, rt.settings, send_step, rt.tenants, rt.budgets, on_wait=waiting,
                         send_together=send_together)
    outfile.parent.mkdir(parents=True, exist_ok=True)
    columns = (
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
    )
    failures: Counter[str] = Counter()  # failed runs by their error
    # --fresh starts over: the output file is emptied before its ids are read (nothing is skipped). Away from
    # a terminal rich draws the bar once, at the end: no refresh thread (~5 ms of CPU a second, BENCHMARKS.md).
    progress_bar = Progress(*columns, console=console, auto_refresh=console.is_terminal)
    with outfile.open("w" if fresh else "a", encoding="utf-8") as sink, progress_bar as bar:
        task = bar.add_task("runs", total=None, detail="submitting")

        def finished(run: Run) -> None:
            sink.write(json.dumps(line_for(run), ensure_ascii=False) + "\n")
            sink.flush()
            if run.status == RunStatus.FAILED:
                failures[run.error or "no reason recorded"] += 1

        def tick(p: BatchProgress) -> None:
            bar.update(task, completed=p.done, detail=(
                f"failed {p.failed} · in flight {p.total - p.done - p.lost} · steps {p.steps} · tokens {p.tokens} · "
                f"${p.cost_usd:.4f}"))

        follower = Follower(rt.store, finished)

        def submitted_chunk(batch_id: str, so_far: int) -> None:  # results are written while the rest goes in
            follower.drain(batch_id)
            follower.progress.total = so_far
            bar.update(task, total=so_far)
            tick(follower.progress)

        try:  # interrupted while submitting or following: a rerun adopts what was submitted
            try:
                submitted = runner.start(lines(), outfile, rejected, after_chunk=submitted_chunk, fresh=fresh)
            except (InvalidRequest, TooLarge) as exc:
                console.print(labelled("error:", "red", exc))
                return 2
            batch_may_be_finished(rt, submitted.batch_id, send_batch_webhook)
            bar.update(task, total=submitted.total)
            if submitted.earlier is not None and (note := earlier_note(submitted.earlier, outfile)):
                console.print(literal(note))
            console.print(literal(f"batch {submitted.batch_id}: {submitted.total} runs to follow"
                                  + (f", {submitted.skipped} already in {outfile}" if submitted.skipped else "")))
            progress = follower.follow(submitted.batch_id, submitted.total, tick)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted:[/yellow] the runs go on in the background; "
                          "run the same command again to collect the rest")
            return 130
    if progress.lost:
        console.print(f"[red]{progress.lost} run(s) vanished from Redis[/red] (was it restarted without "
                      "its AOF?); run the same command again to submit them anew")
        return 1
    if failures:
        console.print(labelled(f"{sum(failures.values())} run(s) failed:", "red", failure_summary(failures)))
    return 1 if submitted.errors or failures else 0


def send_batch_webhook(*args: Any, **kwargs: Any) -> None:
    """Celery's webhook task, loaded only for a batch that has a webhook to send (most have none: the command
    imports no Celery otherwise, worker/tasks/publish.py)."""
    from ..tasks.webhooks import send_delivery

    send_delivery(*args, **kwargs)


def failure_summary(failures: Counter[str], shown: int = 5) -> str:
    """The most common reasons first, with their counts: `3 × LLM call failed (...); 1 × ...`."""
    parts = [f"{n} × {reason}" for reason, n in failures.most_common(shown)]
    if len(failures) > shown:
        parts.append(f"{sum(n for _, n in failures.most_common()[shown:])} with other reasons")
    return "; ".join(parts)


def earlier_note(e: Earlier, outfile: Path) -> str:
    """What this invocation took from the earlier one for the same output file (or "", when nothing of it
    was wanted: every line was in the output file already)."""
    if e.fresh:
        going = (f"; {e.unfinished} of its runs may still be going: `reactq cancel --batch {e.batch_id}` stops them"
                 if e.unfinished else "")
        return f"--fresh: no run of the earlier invocation for {outfile} (batch {e.batch_id}) is adopted{going}"
    parts = []
    if e.adopted:
        states = ", ".join(f"{n} {status}" for status, n in e.adopted.most_common())
        parts.append(f"adopted {sum(e.adopted.values())} run(s) of the earlier invocation for {outfile} "
                     f"(batch {e.batch_id}, {'complete' if e.complete else 'interrupted'}): {states}; "
                     "--fresh submits every line anew")
    if e.resubmitted:
        why = "it completed" if e.complete else "their results had been written"
        parts.append(f"{e.resubmitted} finished run(s) of the earlier invocation (batch {e.batch_id}) are not "
                     f"adopted ({why}, and their lines are missing from {outfile}): submitted anew")
    return "; ".join(parts)  # "" when it had nothing this invocation needed
