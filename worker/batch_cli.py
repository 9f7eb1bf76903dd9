"""The batch command's terminal side: progress bar and result file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .admission import AdmissionRefused, TooLarge
from .batch import BatchRunner, parse_input
from .batch import Progress as BatchProgress
from .core.models import Run
from .errors import InvalidRequest
from .runtime import Runtime


def run_batch_file(
    rt: Runtime, infile: Path, outfile: Path, tenant: str | None, tier: str | None,
    send_step: Callable[..., None], console: Console,
    on_result: Callable[[Run], None] | None = None,
) -> int:
    """Returns the exit code: 0 when every line ran, 1 when some lines were rejected, 2 on nothing to do."""
    with infile.open(encoding="utf-8") as f:
        parsed = parse_input(iter(f), rt.settings, tenant, tier, rt.tenants)
    for error in parsed.errors:
        console.print(f"[red]rejected[/red] {infile}:{error}")
    def waiting(refused: AdmissionRefused) -> None:
        console.print(f"[yellow]waiting {refused.retry_after_s}s:[/yellow] {refused}; the batch goes on after that")

    runner = BatchRunner(rt.store, rt.settings, send_step, on_wait=waiting)
    try:
        batch_id, mapping = runner.start(parsed.specs, outfile)
    except (InvalidRequest, TooLarge) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    skipped = len(parsed.specs) - len(mapping)
    console.print(f"batch {batch_id}: {len(mapping)} runs to follow"
                  + (f", {skipped} already in {outfile}" if skipped else ""))
    outfile.parent.mkdir(parents=True, exist_ok=True)
    columns = (
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
    )
    with outfile.open("a", encoding="utf-8") as sink, Progress(*columns, console=console) as bar:
        task = bar.add_task("runs", total=len(mapping), detail="")

        def finished(run: Run) -> None:
            sink.write(json.dumps(run.result_line(), ensure_ascii=False) + "\n")
            sink.flush()
            if on_result is not None:
                on_result(run)

        def tick(p: BatchProgress) -> None:
            bar.update(task, completed=p.done, detail=(
                f"failed {p.failed} · running {p.running} · steps {p.steps} · tokens {p.tokens} · ${p.cost_usd:.4f}"))

        try:
            progress = runner.follow(list(mapping.values()), finished, tick)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted:[/yellow] the runs go on in the background; "
                          "run the same command again to collect the rest")
            return 130
    if progress.lost:
        console.print(f"[red]{len(progress.lost)} run(s) vanished from Redis[/red] (was it restarted without "
                      "its AOF?); run the same command again to submit them anew")
        return 1
    return 1 if parsed.errors else 0
