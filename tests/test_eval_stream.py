"""`reactq eval` on sets of any size: the on-disk table that scores, pairs and re-reads results, the
streaming summary (bounded failure groups, the worst questions from a heap), and the report's limits
for sets too large for one row per question. Memory is checked with tracemalloc (allocation sizes, not
time)."""

from __future__ import annotations

import io
import json
import random
import tracemalloc
from pathlib import Path

import pytest

from worker.evals.categories import MAX_CATEGORIES
from worker.evals.compare import Change, compare_pairs
from worker.evals.report import PER_QUESTION_LIMIT, write_report
from worker.evals.scoring import MatchMode
from worker.evals.summary import FAILURE_GROUPS, FAILURE_IDS, OTHER_REASONS, _badness, summarise
from worker.evals.table import BASE, NEW, EvalTable


def result(qid: str, answer: str | None, status: str = "succeeded", steps: int = 2, tokens: int = 100,
           error: str | None = None, correct: bool = False) -> dict:
    return {"id": qid, "run_id": f"r-{qid}", "status": status, "answer": answer, "steps": steps,
            "usage": {"prompt_tokens": tokens, "completion_tokens": 0}, "cost_usd": 0.0, "model": "m",
            "error": error, "question": f"question {qid}", "latency_s": 1.0, "correct": correct}


def write_jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_table_rescores_against_the_dataset_keeps_the_last_line_and_skips_junk(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    write_jsonl(results, [result("b", "41"), result("a", "the answer is 42"), result("x", "?", correct=True)])
    with results.open("a") as f:
        f.write("not json\n[1, 2]\n")
        f.write(json.dumps(result("b", "41.0")) + "\n")  # a later line of the same id wins
    with EvalTable() as table:
        table.add_question("a", ("42", MatchMode.CONTAINS))
        table.add_question("b", ("41", MatchMode.NORMALISED))
        table.add_question("c", None)
        assert (table.questions, table.scorable) == (3, 2)
        assert table.expected("a") == ("42", MatchMode.CONTAINS) and table.expected("c") is None
        assert table.expected("nope") is None
        table.load_results(NEW, results)
        lines = list(table.lines(NEW))
        assert [line["id"] for line in lines] == ["a", "b"]  # dataset order; x is not a dataset question
        assert all(line["correct"] for line in lines) and lines[1]["answer"] == "41.0"
        assert lines[1]["match"] == "normalised" and lines[1]["expected"] == "41"
        assert [line["id"] for line in table.all_lines(NEW)] == ["a", "x", "b"]  # file order, x kept
        assert next(line for line in table.all_lines(NEW) if line["id"] == "x")["correct"]  # its own verdict


def test_the_dataset_decides_a_results_line_category(tmp_path: Path) -> None:
    """A results file is re-read with the dataset's categories (an old file may have none, or others);
    a line of a question the dataset does not have keeps its own."""
    results = write_jsonl(tmp_path / "r.jsonl", [
        {**result("a", "1"), "category": "stale"}, result("b", "2"), {**result("c", "3"), "category": "kept"},
        {**result("x", "4"), "category": "its_own"}])
    with EvalTable() as table:
        table.add_question("a", ("1", MatchMode.CONTAINS), "single_tool")
        table.add_question("b", ("2", MatchMode.CONTAINS), "dependent")
        table.add_question("c", ("3", MatchMode.CONTAINS))
        assert table.question("b") == (True, ("2", MatchMode.CONTAINS), "dependent")
        assert table.question("nope") == (False, None, None) and table.category("c") is None
        table.load_results(NEW, results)
        assert [line.get("category") for line in table.lines(NEW)] == ["single_tool", "dependent", None]
        assert [line.get("category") for line in table.all_lines(NEW)][-1] == "its_own"
        s = summarise(table.lines(NEW))
        assert {name: c.questions for name, c in s.categories.items()} == \
            {"single_tool": 1, "dependent": 1, "uncategorised": 1}


def test_pairs_follow_the_dataset_then_the_baseline_only_questions(tmp_path: Path) -> None:
    new = write_jsonl(tmp_path / "new.jsonl", [result("b", "2"), result("a", "no"), result("added", "3")])
    base = write_jsonl(tmp_path / "base.jsonl", [result("gone", "1", correct=True), result("a", "1"),
                                                 result("b", "no")])
    with EvalTable() as table:
        for qid in ("a", "b", "added"):
            table.add_question(qid, ({"a": "1", "b": "2", "added": "3"}[qid], MatchMode.CONTAINS))
        table.load_results(NEW, new)
        table.load_results(BASE, base)
        c = compare_pairs(table.pairs, summarise(table.all_lines(BASE)), summarise(table.lines(NEW)))
        rows = list(c.rows())
        assert [(r.id, r.change) for r in rows] == [
            ("a", Change.REGRESSION), ("b", Change.IMPROVEMENT), ("added", Change.ONLY_NEW), ("gone", Change.ONLY_BASE)]
        assert (c.regression_count, c.improvement_count) == (1, 1)
        assert (c.base.questions, c.base.correct, c.new.questions, c.new.correct) == (3, 2, 3, 2)
        data = c.to_json()
        assert data["regressions"] == ["a"] and data["improvements"] == ["b"] and len(data["questions"]) == 4


def test_failure_groups_and_their_ids_are_bounded() -> None:
    lines = [result(f"q{i}", None, status="failed", error=f"reason {i % (FAILURE_GROUPS + 50)}")
             for i in range(5 * (FAILURE_GROUPS + 50))]
    s = summarise(lines)
    assert s.questions == len(lines) and sum(f.count for f in s.failures) == len(lines)
    assert len(s.failures) == FAILURE_GROUPS + 1
    other = next(f for f in s.failures if f.reason == OTHER_REASONS)
    assert other.count == 5 * 50 and len(other.ids) == FAILURE_IDS
    assert all(len(f.ids) <= FAILURE_IDS for f in s.failures)


def test_worst_questions_from_the_heap_are_those_a_full_sort_finds() -> None:
    rng = random.Random(7)
    lines = [result(f"q{i}", "x", steps=rng.randint(1, 4), tokens=rng.choice([10, 20]), correct=rng.random() < 0.5)
             for i in range(500)]
    want = [line["id"] for line in sorted(lines, key=_badness, reverse=True)[:7]]
    assert [w["id"] for w in summarise(lines, worst=7).worst] == want


def test_report_of_a_large_set_stays_a_page_a_browser_opens(tmp_path: Path) -> None:
    n = PER_QUESTION_LIMIT + 500
    new = [result(f"q{i}", "x", correct=i % 10 != 0, tokens=100 + i % 40) for i in range(n)]
    base = [result(f"q{i}", "x", correct=i % 10 != 5) for i in range(n)]
    with EvalTable() as table:
        for line in new:
            table.add_question(line["id"], None)
        table.load_results(NEW, write_jsonl(tmp_path / "new.jsonl", new))
        table.load_results(BASE, write_jsonl(tmp_path / "base.jsonl", base))
        summary = summarise(table.lines(NEW))
        c = compare_pairs(table.pairs, summarise(table.all_lines(BASE)), summary)
        sink = io.StringIO()
        write_report(sink, "big", summary, table.lines, c)
    html = sink.getvalue()
    assert html.count("class=tokens ") == 0 and "id=tokens-per-question" in html  # a histogram, not n bars
    assert sum(int(part.split("'")[0]) for part in html.split("data-count='")[1:]) == 2 * n  # turns + tokens
    assert html.count("<tr data-change=") == PER_QUESTION_LIMIT
    changed = c.regression_count + c.improvement_count
    assert changed < PER_QUESTION_LIMIT
    assert html.count("data-change='regression'") == c.regression_count == n // 10  # changes are shown first
    assert html.count("data-change='improvement'") == c.improvement_count == n // 10
    assert f"{n - PER_QUESTION_LIMIT} more questions" in html


@pytest.mark.parametrize("categories", [6, 30_000])
def test_scoring_summarising_and_reporting_30k_lines_keeps_python_memory_flat(tmp_path: Path, categories: int
                                                                               ) -> None:
    """The Python heap's peak while loading, summarising and reporting on 30,000 results: per-line
    state is 8 bytes of floats (turns, latency) for the whole set and as much again in the line's
    category, plus a transient sort for a percentile (~1 MB here); everything else is on disk. Holding
    the lines as dicts (as before) took ~40 MB for as many. A set of 30,000 distinct categories costs no
    more: past MAX_CATEGORIES they are pooled under "other"."""
    n = 30_000
    path = tmp_path / "new.jsonl"
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps(result(f"q{i}", f"answer {i}", steps=1 + i % 5)) + "\n")
    with EvalTable() as table:
        tracemalloc.start()
        for i in range(n):
            table.add_question(f"q{i}", (f"answer {i}", MatchMode.CONTAINS), f"category-{i % categories}")
        table.load_results(NEW, path)
        summary = summarise(table.lines(NEW))
        write_report(io.StringIO(), "big", summary, table.lines)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert summary.questions == n and summary.correct == n
    assert len(summary.categories) == min(categories, MAX_CATEGORIES)
    assert sum(c.questions for c in summary.categories.values()) == n
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"
