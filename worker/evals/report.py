"""One self-contained HTML file for an evaluation (pure): the summary table, the same figures per
category, a histogram of turns and tokens per question as inline SVG, and the per-question table (or the
diff against another results file). No script, no stylesheet or font from the network: it opens from a
file on an offline machine.

Written piece by piece to a stream, reading the lines again for each part, so a set of any size costs
flat memory. A page a browser can open is the other limit: past PER_QUESTION_LIMIT questions the tokens
chart becomes a histogram, and the per-question tables show the first PER_QUESTION_LIMIT rows (the
diff: the questions that changed first) and say how many more the results file holds."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from html import escape
from itertools import chain, islice
from typing import Any, TextIO

from .categories import category_of
from .compare import Change, Comparison, QuestionDiff
from .summary import Summary, tokens_of

__all__ = ["PER_QUESTION_LIMIT", "STYLE", "render", "write_report"]

PER_QUESTION_LIMIT = 2000
Lines = Callable[[], Iterable[dict[str, Any]]]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.ok{color:#070}.bad{color:#b00;font-weight:bold}.num{text-align:right}
svg text{font:11px sans-serif}
"""
STYLE = _CSS  # the report's rules (the UI serves them as a stylesheet: its CSP allows no inline style)


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _summary_rows(s: Summary) -> list[tuple[str, str]]:
    return [
        ("questions", str(s.questions)),
        ("correct", str(s.correct)),
        ("success rate", f"{s.success_rate:.1%}"),
        ("partial answers (matching)", f"{s.partial} ({s.partial_correct})"),
        ("turns mean", f"{s.turns_mean:.2f}"),
        ("turns p95", f"{s.turns_p95:g}"),
        ("tokens per question", f"{s.tokens_per_question:.1f}"),
        ("USD per question", f"{s.usd_per_question:.6f}"),
        ("latency p50 (s)", f"{s.latency_p50_s:.2f}"),
        ("latency p95 (s)", f"{s.latency_p95_s:.2f}"),
        ("total tokens", str(s.total_tokens)),
        ("total USD", f"{s.total_usd:.6f}"),
    ]


def _summary_table(summary: Summary, base: Summary | None) -> str:
    head = "<tr><th>figure</th>" + ("<th>base</th>" if base else "") + "<th>this run</th></tr>"
    base_rows = dict(_summary_rows(base)) if base else {}
    rows = "".join(
        f"<tr><th>{_e(name)}</th>" + (f"<td class=num>{_e(base_rows[name])}</td>" if base else "")
        + f"<td class=num data-figure='{_e(name)}'>{_e(value)}</td></tr>"
        for name, value in _summary_rows(summary)
    )
    return f"<table id=summary>{head}{rows}</table>"


def _statuses(s: Summary) -> str:
    return ", ".join(f"{status} {count}" for status, count in s.statuses.items())


def _categories(summary: Summary, comparison: Comparison | None) -> str:
    """One row per category, one column per figure of the summary table (and, against a baseline, the
    base success rate and the category's regressions and improvements)."""
    figures = [name for name, _ in _summary_rows(summary)]
    extra = ("base success rate", "regressions", "improvements") if comparison else ()
    head = "".join(f"<th>{_e(name)}</th>" for name in ("category", *figures, "statuses", *extra))
    rows = []
    for category, s in summary.categories.items():
        cells = [f"<td class=num data-figure='{_e(name)}'>{_e(value)}</td>" for name, value in _summary_rows(s)]
        cells.append(f"<td data-figure='statuses'>{_e(_statuses(s))}</td>")
        if comparison is not None:
            base = comparison.base.categories.get(category)
            changes = comparison.categories.get(category)
            cells += [f"<td class=num data-figure='{_e(name)}'>{_e(value)}</td>" for name, value in (
                ("base success rate", "–" if base is None else f"{base.success_rate:.1%}"),
                ("regressions", changes.regressions if changes else 0),
                ("improvements", changes.improvements if changes else 0))]
        rows.append(f"<tr data-category='{_e(category)}'><th>{_e(category)}</th>{''.join(cells)}</tr>")
    return f"<table id=categories><tr>{head}</tr>{''.join(rows)}</table>"


def _failures(summary: Summary) -> str:
    if not summary.failures:
        return "<p id=failures>No failures.</p>"
    rows = "".join(f"<tr><td>{_e(f.status)}</td><td>{_e(f.reason)}</td><td class=num>{f.count}</td>"
                   f"<td>{_e(', '.join(f.ids[:10]))}</td></tr>" for f in summary.failures)
    return f"<table id=failures><tr><th>status</th><th>reason</th><th>count</th><th>ids</th></tr>{rows}</table>"


def _bars(svg_id: str, label: str, counts: Counter[int], bar_class: str, key: str, values: list[int]) -> str:
    """A histogram as inline SVG: one bar per value (every value between min and max for turns)."""
    top = max(counts.values())
    bar, gap, height = 40, 10, 160
    width = len(values) * (bar + gap) + gap
    parts = []
    for i, value in enumerate(values):
        h = round(counts[value] / top * height)
        x = gap + i * (bar + gap)
        parts.append(
            f"<rect class={bar_class} data-{key}='{value}' data-count='{counts[value]}' x='{x}' y='{height - h + 15}' "
            f"width='{bar}' height='{h}' fill='#4a7fb5'/>"
            f"<text x='{x + bar / 2}' y='{height - h + 12}' text-anchor='middle'>{counts[value]}</text>"
            f"<text x='{x + bar / 2}' y='{height + 30}' text-anchor='middle'>{value}</text>")
    return (f"<svg id={svg_id} xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + 40}' "
            f"role='img' aria-label='{label}'>{''.join(parts)}</svg>")


def _histogram(lines: Lines) -> str:
    counts = Counter(int(line.get("steps") or 0) for line in lines())
    if not counts:
        return "<p>No runs.</p>"
    values = list(range(min(counts), max(counts) + 1))
    return _bars("turns-histogram", "histogram of turns", counts, "bar", "turns", values) + \
        "<p>turns per run (x) · runs (y)</p>"


def _tokens_histogram(lines: Lines, top: int) -> str:
    """Tokens per question in 20 buckets (a set too large for one bar per question)."""
    size = max(1, -(-top // 20))
    counts = Counter(tokens_of(line) // size * size for line in lines())
    return (_bars("tokens-per-question", "tokens per question", counts, "tokens-bucket", "tokens",
                  sorted(counts)) + f"<p>tokens per question, in buckets of {size} (x) · runs (y)</p>")


def _tokens_chart(lines: Lines, questions: int) -> str:
    top = max((tokens_of(line) for line in lines()), default=0) or 1
    if questions == 0:
        return ""
    if questions > PER_QUESTION_LIMIT:
        return _tokens_histogram(lines, top)
    row, width, label = 16, 400, 90
    parts = []
    for i, line in enumerate(lines()):
        tokens = tokens_of(line)
        w = round(tokens / top * width)
        y = i * row
        colour = "#4a7fb5" if line.get("correct") else "#c0392b"
        parts.append(
            f"<text x='0' y='{y + 12}'>{_e(line.get('id'))}</text>"
            f"<rect class=tokens data-id='{_e(line.get('id'))}' data-tokens='{tokens}' x='{label}' y='{y + 2}' "
            f"width='{w}' height='{row - 4}' fill='{colour}'/>"
            f"<text x='{label + w + 4}' y='{y + 12}'>{tokens}</text>")
    return (f"<svg id=tokens-per-question xmlns='http://www.w3.org/2000/svg' width='{label + width + 80}' "
            f"height='{questions * row}' role='img' aria-label='tokens per question'>{''.join(parts)}</svg>")


def _more(shown: int, total: int) -> str:
    return "" if total <= shown else f"<p class=more>{total - shown} more questions are in the results file.</p>"


def _questions(lines: Lines, questions: int) -> Iterator[str]:
    yield ("<table id=questions><tr><th>id</th><th>category</th><th>question</th><th>expected</th><th>answer</th>"
           "<th>status</th><th>turns</th><th>tokens</th><th>ok</th></tr>")
    for line in islice(lines(), PER_QUESTION_LIMIT):
        yield (f"<tr><td>{_e(line.get('id'))}</td><td>{_e(category_of(line))}</td><td>{_e(line.get('question'))}</td>"
               f"<td>{_e(line.get('expected'))}</td><td>{_e(line.get('answer') or line.get('error'))}</td>"
               f"<td>{_e(line.get('status'))}{' (partial)' if line.get('partial') else ''}</td>"
               f"<td class=num>{_e(line.get('steps'))}</td>"
               f"<td class=num>{tokens_of(line)}</td>"
               f"<td class={'ok' if line.get('correct') else 'bad'}>{'✓' if line.get('correct') else '✗'}</td></tr>")
    yield "</table>" + _more(min(questions, PER_QUESTION_LIMIT), questions)


def _diff(comparison: Comparison) -> Iterator[str]:
    def mark(ok: bool | None) -> str:
        return "–" if ok is None else ("✓" if ok else "✗")

    total = comparison.questions
    rows: Iterable[QuestionDiff] = comparison.rows()
    if total > PER_QUESTION_LIMIT:  # what changed comes first; unchanged questions fill what room is left
        rows = chain((r for r in comparison.rows() if r.change != Change.SAME),
                     (r for r in comparison.rows() if r.change == Change.SAME))
    yield (f"<p>{comparison.regression_count} regression(s), {comparison.improvement_count} improvement(s)</p>"
           "<table id=diff><tr><th>id</th><th>question</th><th>base</th><th>this run</th><th>turns</th>"
           "<th>tokens</th><th>change</th></tr>")
    for r in islice(rows, PER_QUESTION_LIMIT):
        yield (f"<tr data-change='{r.change.value}'><td>{_e(r.id)}</td><td>{_e(r.question)}</td>"
               f"<td>{mark(r.base_correct)} {_e(r.base_answer)}</td><td>{mark(r.new_correct)} {_e(r.new_answer)}</td>"
               f"<td class=num>{_e(r.base_steps)} → {_e(r.new_steps)}</td>"
               f"<td class=num>{_e(r.base_tokens)} → {_e(r.new_tokens)}</td>"
               f"<td class={'bad' if r.change == Change.REGRESSION else 'ok'}>{_e(r.change.value)}</td></tr>")
    yield "</table>" + _more(min(total, PER_QUESTION_LIMIT), total)


def write_report(stream: TextIO, title: str, summary: Summary, lines: Lines,
                 comparison: Comparison | None = None) -> None:
    """The whole report as one HTML document, written to `stream`; `lines()` gives this run's results
    (in dataset order) each time it is called."""
    stream.write(f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
                 f"<style>{_CSS}</style></head><body><main><h1>{_e(title)}</h1>")
    for part in ("<h2>Summary</h2>", _summary_table(summary, comparison.base if comparison else None),
                 f"<p id=statuses>runs by status: {_e(_statuses(summary))}</p>",
                 "<h2>Per category</h2>", _categories(summary, comparison),
                 "<h2>Failures</h2>", _failures(summary),
                 "<h2>Turns</h2>", _histogram(lines),
                 "<h2>Tokens per question</h2>", _tokens_chart(lines, summary.questions)):
        stream.write(part)
    if comparison is not None:
        stream.write("<h2>Per question: base → this run</h2>")
        stream.writelines(_diff(comparison))
    else:
        stream.write("<h2>Per question</h2>")
        stream.writelines(_questions(lines, summary.questions))
    stream.write("</main></body></html>\n")


def render(title: str, summary: Summary, lines: Iterable[dict[str, Any]],
           comparison: Comparison | None = None) -> str:
    """The report as a string (small sets; `lines` is read several times, so pass a list)."""
    buffer = io.StringIO()
    items = list(lines)
    write_report(buffer, title, summary, lambda: items, comparison)
    return buffer.getvalue()
