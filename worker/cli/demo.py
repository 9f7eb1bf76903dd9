"""`reactq demo`: the bundled evaluation set on the embedded default, starting (and afterwards stopping) whatever
is missing: Redis, api_stub, a step worker, a sandbox worker."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..evals.summary import tokens_of
from ..names import SANDBOX_QUEUE, STEPS_QUEUE
from . import base
from .display import literal, print_trace

if TYPE_CHECKING:
    from ..runtime.context import Runtime
    from .evaluation import EvalRun
    from .local_stack import Started


@click.command()
@click.option("--out", "outfile", default="reactq-demo-results.jsonl", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path))
def demo(outfile: Path) -> None:
    """Run the bundled evaluation set on the embedded default, starting whatever is missing."""
    sys.exit(run_demo(outfile, base.console, base.out))


def run_demo(outfile: Path, console: Console, out: Console) -> int:
    from ..config import get_settings
    from ..evals.table import EvalTable
    from ..runtime.context import get_runtime
    from ..tasks.steps import send_step
    from .evaluation import bundled_set_path, run_eval
    from .local_stack import http_ok, redis_reachable, start_redis, start_stub, start_worker  # not at `reactq --help`

    rt = get_runtime(get_settings)
    s = rt.settings
    workdir = Path(tempfile.mkdtemp(prefix="reactq-demo-"))
    started: list[Started] = []
    try:
        if not redis_reachable(s.redis_url):
            console.print(f"starting redis-server for {s.redis_url}")
            started.append(start_redis(s.redis_url, workdir))
        if not http_ok(s.llm_base_url.rstrip("/") + "/models"):
            console.print(f"starting api_stub at {s.llm_base_url}")
            started.append(start_stub(s.llm_base_url, workdir))
        for queue, name in ((STEPS_QUEUE, "steps"), (SANDBOX_QUEUE, "sandbox")):
            if rt.cluster.live_workers(queue) == 0:
                console.print(f"starting a {name} worker (log: {workdir}/worker-{name}.log)")
                # The demo alone opts into `auto`: Docker when an engine answers, else the weaker process
                # backend, which every result then names (production's default is docker, fail closed).
                env = {"REACTQ_SANDBOX_BACKEND": os.environ.get("REACTQ_SANDBOX_BACKEND", "auto")}
                started.append(start_worker(name, 64 if name == "steps" else 2, workdir, env=env))
        if outfile.exists():
            outfile.unlink()
        t0 = time.monotonic()
        with EvalTable() as table:
            result = run_eval(rt, bundled_set_path(), outfile, send_step, console, table, fresh=True)
            _summary(out, result, time.monotonic() - t0, outfile)
            _dependent_trace(out, rt, result)
        structured_out = outfile.with_name(outfile.stem + "-structured.jsonl")
        with EvalTable() as table:
            structured = run_eval(rt, bundled_set_path("structured_set.jsonl"), structured_out, send_step, console,
                                  table, fresh=True)
            _structured_summary(out, structured, structured_out)
        code = result.code or structured.code or _session_run(out, rt, send_step)
        if code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            console.print(f"service logs are in {workdir}")
        return code
    finally:
        for service in reversed(started):
            service.stop()


def _summary(out: Console, result: EvalRun, elapsed: float, outfile: Path) -> None:
    """The demo's table, and its success line from the evaluation scoring."""
    table = Table(title="reactq demo", show_lines=False)
    for column in ("id", "question", "answer", "status", "steps", "tokens", "ok"):
        table.add_column(column, overflow="fold")
    for line in result.table.lines():
        table.add_row(literal(line["id"]), literal(str(line["question"])[:60]),
                      literal(str(line["answer"] or line["error"] or "")[:60]), literal(line["status"]),
                      str(line["steps"]), str(tokens_of(line)),
                      "[green]✓[/green]" if line["correct"] else "[red]✗[/red]")
    out.print(table)
    s = result.summary
    out.print(Text.assemble((f"{s.correct}/{result.questions} correct", "bold"), literal(
        f" · {s.questions} runs in {elapsed:.1f}s · {s.total_tokens} tokens · ${s.total_usd:.5f} · "
        f"results in {outfile}")))


def _structured_summary(out: Console, result: EvalRun, outfile: Path) -> None:
    """The structured batch: each run's `output` object (its output schema validated it) and its fields'
    scores against the expected object."""
    table = Table(title="structured answers (output_schema)")
    for column in ("id", "question", "output", "field scores", "ok"):
        table.add_column(column, overflow="fold")
    for line in result.table.lines():
        scores = ", ".join(f"{name} {score:g}" for name, score in (line.get("field_scores") or {}).items())
        table.add_row(literal(line["id"]), literal(str(line["question"])[:40]),
                      literal(json.dumps(line.get("output"), ensure_ascii=False)[:80]), literal(scores),
                      "[green]✓[/green]" if line["correct"] else "[red]✗[/red]")
    out.print(table)
    s = result.summary
    out.print(Text.assemble((f"{s.correct}/{result.questions} structured answers correct", "bold"),
                            literal(f" · results in {outfile}")))


def _dependent_trace(out: Console, rt: Runtime, result: EvalRun) -> None:
    """The trace of the longest dependent run: each step built from what the one before observed."""
    dependent = [line for line in result.table.lines()
                 if line.get("category") == "dependent" and line.get("run_id") and line.get("correct")]
    if dependent:
        line = max(dependent, key=lambda item: item.get("steps") or 0)
        run = rt.store.load_run(line["run_id"])
        if run is not None:
            out.rule(f"a dependent run, step by step ({line['id']})")
            print_trace(out, run, rt.store.load_steps(run.id))


SESSION_QUESTION = ("Run these python cells in order:\n```python\nprices = [3.5, 12.25, 7.0]\n```\n"
                    "```python\ntotal = sum(prices)\n```\n"
                    "```python\nprint(f'{len(prices)} items, {total:.2f} in all')\n```")


def _session_run(out: Console, rt: Runtime, send_step: Callable[..., None]) -> int:
    """One run whose python uses variables of its earlier steps (a python session); its trace. 0 if it answered."""
    from ..core.models import RunSpec
    from ..service.batch import BatchRunner
    from ..service.submit import submit

    [run] = submit(rt.store, [RunSpec(question=SESSION_QUESTION, python_session=True)], rt.settings, send_step,
                   interactive=True, tenants=rt.tenants, budgets=rt.budgets)
    BatchRunner(rt.store, rt.settings, send_step, rt.tenants, rt.budgets).follow(
        [run.id], lambda r: None, lambda p: None, timeout_s=300)
    finished = rt.store.load_run(run.id) or run
    out.rule("a python session: each cell uses what the cells before it defined")
    print_trace(out, finished, rt.store.load_steps(run.id))
    return 0 if finished.answer and "22.75 in all" in finished.answer else 1

