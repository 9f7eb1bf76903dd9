"""`reactq eval DATASET.jsonl [--out R.jsonl] [--compare OTHER.jsonl] [--report R.html] [--json]`."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..evals.compare import Change, Comparison, compare_pairs
from ..evals.summary import Summary
from ..runtime.context import Runtime
from .base import _runtime, _send_step, console, out
from .display import labelled, literal

CHANGES_SHOWN = 50  # questions that changed, in the terminal's table


@click.command("eval")
@click.argument("dataset", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "outfile", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="results JSONL (default: DATASET's name + .results.jsonl in the current directory); "
                   "running again with the same --out runs only what is missing")
@click.option("--compare", "other", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="an earlier results file to compare with, per question and in total")
@click.option("--report", "report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write one self-contained HTML report here")
@click.option("--json", "as_json", is_flag=True, help="print the summary (and comparison) as JSON")
@click.option("--no-store", is_flag=True, help="do not also store the --report in Redis for the UI's /ui/evals "
              "(REACTQ_EVAL_REPORT_STORE=false does the same for every run)")
@click.option("--tenant", default=None, help="default tenant for lines without one")
@click.option("--tier", default=None, help="default tier for lines without one")
@click.option("--fresh", is_flag=True, help="start over: empty --out and run every question anew, adopting no "
              "run of an earlier invocation for the same --out")
def eval_command(dataset: Path, outfile: Path | None, other: Path | None, report: Path | None, as_json: bool,
                 no_store: bool, tenant: str | None, tier: str | None, fresh: bool) -> None:
    """Run an evaluation set (batch lines plus `expected`, `match` and an optional `category`) and score
    it; every figure is also given per category (lines without one: "uncategorised")."""
    from ..evals.report import write_report
    from ..evals.summary import summarise
    from ..evals.table import BASE, EvalTable
    from .evaluation import run_eval

    outfile = outfile or Path(dataset.stem + ".results.jsonl")
    with EvalTable() as table:
        rt = _runtime()
        result = run_eval(rt, dataset, outfile, _send_step(), console, table, tenant, tier, fresh=fresh)
        if result.code in (2, 130):
            sys.exit(result.code)
        summary = result.summary
        comparison = None
        if other is not None:
            table.load_results(BASE, other)
            comparison = compare_pairs(table.pairs, summarise(table.all_lines(BASE)), summary)
        if report is not None:
            report.parent.mkdir(parents=True, exist_ok=True)
            with report.open("w", encoding="utf-8") as sink:
                write_report(sink, f"reactq eval: {dataset.name}", summary, table.lines, comparison)
            console.print(literal(f"report written to {report}"))
            if not no_store and rt.settings.eval_report_store:
                store_report(rt, report, dataset.name, summary, table.lines, tenant)
        if as_json:
            head = {"dataset": str(dataset), "results": str(outfile), "summary": summary.to_json()}
            text = json.dumps(head)
            if comparison is None:
                click.echo(text)
            else:  # the per-question rows are streamed: a set of any size prints with flat memory
                click.echo(text[:-1] + ', "comparison": ', nl=False)
                for chunk in comparison.json_chunks():
                    click.echo(chunk, nl=False)
                click.echo("}")
        else:
            print_summary(out, summary)
            if comparison is not None:
                print_comparison(out, comparison)
    sys.exit(result.code)


SUMMARY_FIELDS = ("questions", "correct", "success_rate", "partial", "turns_mean", "tokens_per_question",
                  "usd_per_question", "latency_p95_s", "total_tokens", "total_usd", "statuses")


def store_report(rt: Runtime, report: Path, name: str, summary: Summary, lines: Callable[[], Iterable[dict]],
                 tenant: str | None) -> None:
    """Keep the report in Redis too, under the tenant of the set's runs, for the UI (a failure to is a
    warning: the file is written)."""
    from ..store.connection import RedisError
    from ..store.eval_reports import ReportTooLarge, from_settings

    first = next(iter(lines()), None)
    run = rt.store.load_run(first["run_id"]) if first and first.get("run_id") else None
    owner = run.spec.tenant if run is not None else (rt.tenants.id_of(tenant or "default") or tenant or "default")
    figures = summary.to_json()
    report_id = uuid.uuid4().hex
    try:
        from_settings(rt.redis, rt.settings).save(owner, report_id, name, report.read_text(encoding="utf-8"),
                                                  {k: figures[k] for k in SUMMARY_FIELDS})
    except (ReportTooLarge, RedisError) as exc:
        console.print(labelled("warning:", "yellow", f"the report was not stored for the UI: {exc}"))
        return
    console.print(literal(f"report stored for the UI: /ui/evals/{report_id} (tenant {owner})"))


def print_summary(target: Console, s: Summary) -> None:
    table = Table(title="evaluation", show_header=False)
    for name, value in (
        ("success rate", f"{s.correct}/{s.questions} ({s.success_rate:.1%})"),
        ("partial answers", f"{s.partial} at a limit, {s.partial_correct} of them matching"),
        ("turns mean / p95", f"{s.turns_mean:.2f} / {s.turns_p95:g}"),
        ("tokens per question", f"{s.tokens_per_question:.1f}"),
        ("USD per question", f"{s.usd_per_question:.6f}"),
        ("latency p50 / p95", f"{s.latency_p50_s:.2f}s / {s.latency_p95_s:.2f}s"),
        ("runs by status", statuses(s)),
    ):
        table.add_row(name, literal(value))
    target.print(table)
    print_categories(target, s)
    if s.field_scores:
        fields = Table(title="field scores")
        fields.add_column("field", overflow="fold")
        fields.add_column("mean score", justify="right")
        for name, score in s.field_scores.items():
            fields.add_row(literal(name), f"{score:.1%}")
        target.print(fields)
    if s.failures:
        failures = Table(title="failures")
        for column in ("status", "reason", "count", "ids"):
            failures.add_column(column, overflow="fold")
        for f in s.failures:
            failures.add_row(literal(f.status), literal(f.reason), str(f.count), literal(", ".join(f.ids[:8])))
        target.print(failures)
    worst = Table(title="worst questions")
    for column in ("id", "question", "answer", "status", "turns", "tokens", "ok"):
        worst.add_column(column, overflow="fold")
    for w in s.worst:
        worst.add_row(literal(w["id"]), literal(str(w["question"] or "")[:50]), literal(str(w["answer"] or "")[:50]),
                      literal(w["status"]), literal(w["steps"]), literal(w["tokens"]), "✓" if w["correct"] else "✗")
    target.print(worst)


def statuses(s: Summary, sep: str = ", ") -> str:
    return sep.join(f"{status} {count}" for status, count in s.statuses.items())


def print_categories(target: Console, s: Summary) -> None:
    """The figures of the summary table, one row per category (lines without one: "uncategorised")."""
    table = Table(title="per category")
    table.add_column("category", no_wrap=True)
    for column in ("correct", "partial", "statuses", "turns mean/p95", "tokens/q", "USD/q", "latency p50/p95"):
        table.add_column(column, overflow="fold", min_width=13 if column == "statuses" else None)
    for name, c in s.categories.items():
        table.add_row(literal(name), f"{c.correct}/{c.questions} ({c.success_rate:.1%})",
                      f"{c.partial} ({c.partial_correct} matching)", literal(statuses(c, "\n")),
                      f"{c.turns_mean:.2f} / {c.turns_p95:g}", f"{c.tokens_per_question:.1f}",
                      f"{c.usd_per_question:.6f}", f"{c.latency_p50_s:.2f}s / {c.latency_p95_s:.2f}s")
    target.print(table)


def print_comparison(target: Console, c: Comparison) -> None:
    totals = Table(title="compared with the earlier results")
    for column in ("figure", "before", "now"):
        totals.add_column(column)
    for name, before, now in (
        ("success rate", f"{c.base.success_rate:.1%}", f"{c.new.success_rate:.1%}"),
        ("turns mean", f"{c.base.turns_mean:.2f}", f"{c.new.turns_mean:.2f}"),
        ("tokens per question", f"{c.base.tokens_per_question:.1f}", f"{c.new.tokens_per_question:.1f}"),
        ("USD per question", f"{c.base.usd_per_question:.6f}", f"{c.new.usd_per_question:.6f}"),
        ("latency p95", f"{c.base.latency_p95_s:.2f}s", f"{c.new.latency_p95_s:.2f}s"),
    ):
        totals.add_row(name, before, now)
    target.print(totals)
    categories = Table(title="per category, compared")
    for column in ("category", "success rate before", "now", "regressions", "improvements"):
        categories.add_column(column, overflow="fold")
    for name, changes in c.categories.items():
        base, new = c.base.categories.get(name), c.new.categories.get(name)
        categories.add_row(literal(name), "–" if base is None else f"{base.correct}/{base.questions}",
                           "–" if new is None else f"{new.correct}/{new.questions}",
                           str(changes.regressions), str(changes.improvements))
    target.print(categories)
    changed = [r for r in islice((r for r in c.rows() if r.change != Change.SAME), CHANGES_SHOWN + 1)]
    if changed:
        rows = Table(title="questions that changed", caption=(
            f"the first {CHANGES_SHOWN}; --json or --report lists them all" if len(changed) > CHANGES_SHOWN else None))
        for column in ("id", "change", "before", "now", "turns", "tokens"):
            rows.add_column(column, overflow="fold")
        for r in changed[:CHANGES_SHOWN]:
            style = "red" if r.change == Change.REGRESSION else "green"
            rows.add_row(literal(r.id), Text(r.change.value, style), literal(str(r.base_answer or "")[:40]),
                         literal(str(r.new_answer or "")[:40]), literal(f"{r.base_steps} → {r.new_steps}"),
                         literal(f"{r.base_tokens} → {r.new_tokens}"))
        target.print(rows)
    target.print(f"[bold]{c.regression_count} regression(s)[/bold], {c.improvement_count} improvement(s)")

