"""The pure side of `reactq eval`: match modes, the summary figures, comparing two results files, the
HTML report, and the bundled set's shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from worker.evals.categories import (
    BUNDLED_CATEGORIES,
    MAX_CATEGORIES,
    MAX_CATEGORY_CHARS,
    OTHER,
    UNCATEGORISED,
    Buckets,
    category_of,
    check_category,
)
from worker.evals.compare import Change, compare
from worker.evals.report import render
from worker.evals.scoring import MatchMode, check_expected, matches, normalise
from worker.evals.summary import WRONG_ANSWER, percentile, summarise

ROOT = Path(__file__).resolve().parent.parent

# --- scoring ---------------------------------------------------------------------------------

CASES = [
    # (answer, expected, mode, matches?)
    ("126", "126", "exact", True),
    ("  126\n", "126", "exact", True),
    ("126.", "126", "exact", False),
    ("Canberra", "canberra", "exact", False),
    ("1,229", "1229.0", "normalised", True),
    ("1229", "1,229", "normalised", True),
    ("1,229.50", "1229.5", "normalised", True),
    ("0.30000000000000004", "0.3", "normalised", True),
    ("2432902008176640000", "2,432,902,008,176,640,000", "normalised", True),
    ("2432902008176640001", "2432902008176640000", "normalised", False),  # big integers compared exactly
    ("[9, 5, 3, 1]", "9, 5, 3, 1", "normalised", True),
    ("[9, 5, 3, 1]", "1, 3, 5, 9", "normalised", False),
    ("Jane  AUSTEN!", "jane austen", "normalised", True),
    ("Jane Austen wrote it", "jane austen", "normalised", False),
    ("-5", "5", "normalised", False),
    ("5-3", "5 - 3", "normalised", True),
    ("x = -5", "x=-5", "normalised", True),
    ("2.5e3", "2500", "normalised", True),
    ("The answer is 42.", "42", "contains", True),
    ("420", "42", "contains", False),
    ("42.5", "42", "contains", False),
    ("Canberra is the capital of Australia.", "canberra", "contains", True),
    ("Canberra is the capital", "capital of Australia", "contains", False),
    ("speed is 299,792,458 m/s", "299792458", "contains", True),
    ("12 * 7 = 84; 9 * 9 = 81", "81", "contains", True),
    ("anything", "", "contains", False),
    ("29; 2 ** 16 = 65536", r"^29; .*65536$", "regex", True),
    ("x29; 65536", r"^29;", "regex", False),
    ("TOKYO", r"(?i)tokyo", "regex", True),
    ("TOKYO", r"tokyo", "regex", False),
    ("about 6,650 kilometres long", ["6650 km", "6,650 kilometres"], "any_of", True),
    ("about 6,650 miles", ["6650 km", "6,650 kilometres"], "any_of", False),
    ("Newton", "Newton", "any_of", True),
]


@pytest.mark.parametrize(("answer", "expected", "mode", "want"), CASES)
def test_match_modes(answer: str, expected: str | list[str], mode: str, want: bool) -> None:
    assert matches(answer, expected, mode) is want


@pytest.mark.parametrize("mode", list(MatchMode))
def test_no_answer_never_matches(mode: MatchMode) -> None:
    assert matches(None, ["x"] if mode == MatchMode.ANY_OF else "x", mode) is False


def test_default_mode_is_contains() -> None:
    assert matches("it is 42 exactly", "42") and not matches("it is 420", "42")


def test_normalise_tokens() -> None:
    assert normalise("Hello, World! 1,000 and 2.50") == ["hello", "world", 1000, "and", 2.5]


@pytest.mark.parametrize(("expected", "mode", "problem"), [
    ("42", "exact", None),
    ("42", "contains", None),
    (["a", "b"], "any_of", None),
    ("42", "fuzzy", "unknown match 'fuzzy'"),
    ("a", "any_of", "needs `expected` as a non-empty list"),
    ([], "any_of", "needs `expected` as a non-empty list"),
    (["a", "..."], "any_of", "no letters or digits"),
    (["a"], "normalised", "needs `expected` as one string"),
    ("(unclosed", "regex", "not a valid regular expression"),
    ("!!!", "normalised", "no letters or digits"),
    ("!!!", "exact", None),
])
def test_check_expected(expected: str | list[str], mode: str, problem: str | None) -> None:
    found = check_expected(expected, mode)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_matches_rejects_a_list_outside_any_of() -> None:
    with pytest.raises(ValueError, match="one expected string"):
        matches("a", ["a"], "contains")


# --- summary -----------------------------------------------------------------------------------

def line(qid: str, correct: bool, steps: int = 2, tokens: tuple[int, int] = (100, 20), cost: float = 0.001,
         latency: float | None = 1.0, status: str = "succeeded", error: str | None = None,
         answer: str | None = "x") -> dict:
    return {"id": qid, "question": f"question {qid}", "status": status, "answer": answer, "steps": steps,
            "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]}, "cost_usd": cost,
            "error": error, "correct": correct, "latency_s": latency, "expected": "x", "match": "contains"}


@pytest.mark.parametrize(("values", "q", "want"), [
    ([], 50, 0.0), ([7], 95, 7.0), ([1, 2, 3, 4], 50, 2.0), ([1, 2, 3, 4], 95, 4.0),
    (list(range(1, 101)), 95, 95.0), (list(range(1, 101)), 50, 50.0), ([3, 1, 2], 100, 3.0), ([3, 1, 2], 0, 1.0),
])
def test_percentile_nearest_rank(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == want


def test_summary_figures() -> None:
    lines = [
        line("a", True, steps=2, tokens=(100, 20), cost=0.001, latency=1.0),
        line("b", True, steps=3, tokens=(200, 40), cost=0.002, latency=2.0),
        line("c", False, steps=2, tokens=(100, 20), cost=0.001, latency=3.0, answer="nope"),
        line("d", False, steps=8, tokens=(900, 100), cost=0.009, latency=9.0, status="max_steps",
             error="reached max_steps (8)\nmore detail", answer=None),
        line("e", False, steps=1, tokens=(50, 0), cost=0.0, latency=None, status="failed", error="LLM gave up"),
        line("f", False, steps=1, tokens=(50, 0), cost=0.0, latency=0.5, status="failed", error="LLM gave up"),
    ]
    s = summarise(lines, worst=3)
    assert (s.questions, s.correct) == (6, 2)
    assert s.success_rate == pytest.approx(2 / 6)
    assert s.turns_mean == pytest.approx(17 / 6) and s.turns_p95 == 8
    assert s.total_tokens == 120 + 240 + 120 + 1000 + 50 + 50
    assert s.tokens_per_question == pytest.approx(s.total_tokens / 6)
    assert s.usd_per_question == pytest.approx(0.013 / 6)
    assert s.latency_p50_s == 2.0 and s.latency_p95_s == 9.0  # the run without a latency is left out
    assert [(f.status, f.reason, f.count) for f in s.failures] == [
        ("failed", "LLM gave up", 2), ("max_steps", "reached max_steps (8)", 1), ("succeeded", WRONG_ANSWER, 1)]
    assert s.failures[0].ids == ["e", "f"]
    assert [w["id"] for w in s.worst] == ["d", "c", "f"]  # wrong first, then most turns, tokens, latency
    assert s.worst[0]["tokens"] == 1000
    assert json.loads(json.dumps(s.to_json()))["failures"][0]["count"] == 2


def test_summary_of_nothing() -> None:
    s = summarise([])
    assert (s.questions, s.correct, s.success_rate, s.turns_p95, s.failures, s.worst) == (0, 0, 0.0, 0.0, [], [])


def test_all_correct_has_no_failures() -> None:
    s = summarise([line("a", True), line("b", True)])
    assert s.success_rate == 1.0 and s.failures == []


# --- compare -----------------------------------------------------------------------------------

def test_compare_flags_regressions_improvements_and_missing() -> None:
    base = [line("a", True), line("b", False), line("c", True, steps=2), line("gone", True)]
    new = [line("a", False, answer="wrong"), line("b", True), line("c", True, steps=4), line("added", True)]
    c = compare(new, base)
    by_id = {r.id: r for r in c.rows()}
    assert [r.id for r in c.regressions()] == ["a"] and [r.id for r in c.improvements()] == ["b"]
    assert (c.regression_count, c.improvement_count, c.questions) == (1, 1, 5)
    assert by_id["c"].change == Change.SAME and (by_id["c"].base_steps, by_id["c"].new_steps) == (2, 4)
    assert by_id["added"].change == Change.ONLY_NEW and by_id["added"].base_correct is None
    assert by_id["gone"].change == Change.ONLY_BASE and by_id["gone"].new_steps is None
    assert [r.id for r in c.rows()] == ["a", "b", "c", "added", "gone"]
    assert c.base.correct == 3 and c.new.correct == 3
    data = c.to_json()
    assert data["regressions"] == ["a"] and data["questions"][0]["change"] == "regression"
    json.dumps(data)


# --- report ------------------------------------------------------------------------------------

def test_report_is_self_contained_and_escaped() -> None:
    lines = [line("a", True, steps=2), line("b", True, steps=2), line("<script>", False, steps=5)]
    html = render("t <b>", summarise(lines), lines)
    assert "<script>" not in html and "&lt;script&gt;" in html and "t &lt;b&gt;" in html
    for forbidden in ("http://", "https://", "src=", "<link", "@import"):
        assert forbidden not in html.replace("http://www.w3.org/2000/svg", ""), forbidden
    assert "data-turns='2' data-count='2'" in html and "data-turns='5' data-count='1'" in html
    assert "data-turns='3' data-count='0'" in html  # the histogram has every value between min and max
    assert html.count("class=tokens") == 3 and "id=questions" in html and "id=diff" not in html


def test_report_with_comparison_shows_the_diff() -> None:
    base, new = [line("a", True)], [line("a", False, answer="nope")]
    html = render("t", summarise(new), new, compare(new, base))
    assert "data-change='regression'" in html and "1 regression(s)" in html and "id=questions" not in html


# --- the bundled set ---------------------------------------------------------------------------

def test_bundled_set_has_the_demo_questions_and_harder_ones() -> None:
    items = [json.loads(t) for t in (ROOT / "worker/data/eval_set.jsonl").read_text().splitlines()]
    sample = [json.loads(t) for t in (ROOT / "worker/data/sample_batch.jsonl").read_text().splitlines()]
    assert len(items) >= 40 and len({i["id"] for i in items}) == len(items)
    by_id = {i["id"]: i for i in items}
    assert all(by_id[s["id"]]["question"] == s["question"] for s in sample)
    structured = [json.loads(t) for t in (ROOT / "worker/data/structured_set.jsonl").read_text().splitlines()]
    assert {i["match"] for i in items + structured} == {m.value for m in MatchMode}  # the demo runs both
    assert all(check_expected(i["expected"], i["match"]) is None for i in items)
    multi_part = [i for i in items if i["question"].count(" and ") >= 2 or "and what" in i["question"]]
    assert len(multi_part) >= 8


# --- hostile answers: each is scored in bounded work (no huge integer is ever built) --------------

HOSTILE = [
    "1e999999999",
    "-1E-999999999",
    "1e" + "9" * 50,
    "9" * 1_000_000,
    "1," * 500_000 + "1",
    "0." + "0" * 1_000_000 + "1",
    "(" * 200_000 + "42" + ")" * 200_000,
    "[" * 100_000 + "x" + "]" * 100_000,
    " ".join(["1e999999"] * 50_000),
    "4" * 4301,  # past Python's int-from-string digit limit
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answer", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("mode", ["normalised", "contains", "exact", "any_of"])
def test_a_hostile_answer_is_scored_and_does_not_match(answer: str, mode: str) -> None:
    expected: str | list[str] = ["7", "seven"] if mode == "any_of" else "7"
    assert matches(answer, expected, mode) is False


@pytest.mark.timeout(60)
def test_huge_numbers_compare_as_numbers_without_being_expanded() -> None:
    assert matches("1e999999999", "1E+999999999", "normalised")
    assert matches("10e999999998", "1e999999999", "normalised")
    assert not matches("1e999999999", "1e999999998", "normalised")
    assert matches("the answer is 2.5e-999999", "2.50e-999999", "contains")
    assert matches("1.0000000001e-999999", "1e-999999", "normalised")  # within the relative tolerance
    assert not matches("1.0000000001e999999", "1e999999", "normalised")  # integers: exactly
    assert matches("123456.7890000001", "123456.789", "normalised")  # relative tolerance
    assert not matches("1.001e-5", "1e-5", "normalised")
    assert matches("9" * 399, "9" * 399, "normalised") and not matches("9" * 399, "9" * 398, "normalised")
    long_number = "7" * 5000
    assert matches(long_number, long_number, "normalised")  # past the number limit: compared as its text
    assert not matches(long_number, long_number + "7", "normalised")


def test_only_the_start_of_a_very_long_answer_is_scored() -> None:
    from worker.evals.scoring import MAX_TOKENS

    assert len(normalise("a " * (MAX_TOKENS * 3))) == MAX_TOKENS
    assert matches("x " * 10 + "42", "42", "contains")
    assert not matches("x " * MAX_TOKENS + "42", "42", "contains")


# --- categories --------------------------------------------------------------------------------

def test_every_figure_is_reported_per_category() -> None:
    lines = [
        {**line("a", True, steps=2, tokens=(100, 20), cost=0.001, latency=1.0), "category": "single_tool"},
        {**line("b", False, steps=8, tokens=(900, 100), cost=0.009, latency=9.0, status="max_steps",
                error="reached max_steps (8)", answer=None), "category": "dependent"},
        {**line("c", True, steps=3, tokens=(200, 40), cost=0.002, latency=2.0), "category": "single_tool"},
        line("d", False, steps=1, tokens=(50, 0), cost=0.0, latency=0.5, status="failed", error="LLM gave up"),
        {**line("e", True, steps=4), "category": "no spaces allowed"},  # a bad name read back: uncategorised
    ]
    s = summarise(lines)
    assert list(s.categories) == ["single_tool", "dependent", UNCATEGORISED]  # in order of first appearance
    assert s.statuses == {"succeeded": 3, "failed": 1, "max_steps": 1}
    single, dependent, none = (s.categories[name] for name in s.categories)
    assert (single.questions, single.correct, single.success_rate, single.statuses) == (2, 2, 1.0, {"succeeded": 2})
    assert single.turns_mean == 2.5 and single.turns_p95 == 3 and single.total_tokens == 360
    assert single.usd_per_question == pytest.approx(0.0015) and (single.latency_p50_s, single.latency_p95_s) == (1, 2)
    assert (dependent.questions, dependent.correct, dependent.statuses) == (1, 0, {"max_steps": 1})
    assert [(f.status, f.reason, f.ids) for f in dependent.failures] == [("max_steps", "reached max_steps (8)", ["b"])]
    assert (none.questions, none.correct, none.statuses) == (2, 1, {"failed": 1, "succeeded": 1})
    # each category's figures are those of its lines summarised alone
    alone = summarise([lines[0], lines[2]], worst=0)
    assert {k: v for k, v in single.to_json().items() if k != "categories"} == \
        {k: v for k, v in alone.to_json().items() if k != "categories"}
    data = json.loads(json.dumps(s.to_json()))
    assert data["categories"]["dependent"]["statuses"] == {"max_steps": 1}
    assert "worst" not in data["categories"]["dependent"] and "categories" not in data["categories"]["dependent"]
    assert sum(c["questions"] for c in data["categories"].values()) == 5


def test_categories_are_capped_and_the_rest_pooled_under_other() -> None:
    lines = [{**line(f"q{i}", i % 2 == 0), "category": f"c{i % (MAX_CATEGORIES + 30)}"} for i in range(400)]
    s = summarise(lines)
    assert len(s.categories) == MAX_CATEGORIES and list(s.categories)[-1] == OTHER
    assert list(s.categories)[: MAX_CATEGORIES - 1] == [f"c{i}" for i in range(MAX_CATEGORIES - 1)]
    assert sum(c.questions for c in s.categories.values()) == 400
    kept = sum(s.categories[f"c{i}"].questions for i in range(MAX_CATEGORIES - 1))
    assert s.categories[OTHER].questions == 400 - kept == 31 * 5  # c49..c79, five lines each


def test_buckets_pool_past_the_limit() -> None:
    buckets: Buckets[list[int]] = Buckets(list, limit=3)
    for i, name in enumerate(["a", "b", "c", "a", "d", OTHER]):
        buckets.get(name).append(i)
    assert dict(buckets.items()) == {"a": [0, 3], "b": [1], OTHER: [2, 4, 5]}
    with pytest.raises(ValueError):
        Buckets(list, limit=1)


@pytest.mark.parametrize(("name", "good"), [
    ("single_tool", True), ("chinese", True), ("A-1_b", True), ("x" * MAX_CATEGORY_CHARS, True),
    ("", False), ("x" * (MAX_CATEGORY_CHARS + 1), False), ("two words", False), ("中文", False),
    ("a/b", False), ("<b>", False), ("tab\t", False),
])
def test_category_names(name: str, good: bool) -> None:
    if good:
        assert check_category(name) == name and category_of({"category": name}) == name
    else:
        with pytest.raises(ValueError, match="1 to 40 letters"):
            check_category(name)
        assert category_of({"category": name}) == UNCATEGORISED
    assert category_of({}) == category_of({"category": 7}) == UNCATEGORISED


def test_a_bad_category_is_a_line_error(tmp_path: Path) -> None:
    from worker.config import Settings
    from worker.service.batch_input import ParsedLine, iter_input

    infile = tmp_path / "set.jsonl"
    rows = [{"id": "ok", "question": "What is 2 + 2?", "expected": "4", "category": "single_tool"},
            {"id": "spaces", "question": "q", "expected": "4", "category": "no spaces"},
            {"id": "long", "question": "q", "category": "x" * 41},
            {"id": "number", "question": "q", "category": 3},
            {"id": "none", "question": "What is 2 + 2?"}]
    infile.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parsed = list(iter_input(infile, Settings(), None, None))
    assert isinstance(parsed[0], ParsedLine) and parsed[0].category == "single_tool"
    assert parsed[0].expected == ("4", MatchMode.CONTAINS)
    assert [str(p) for p in parsed[1:3]] == [
        f"line {n}: category: Value error, a category is 1 to 40 letters, digits, '_' or '-'" for n in (2, 3)]
    assert str(parsed[3]).startswith("line 4: category: Input should be a valid string")
    assert isinstance(parsed[4], ParsedLine) and parsed[4].category is None


def test_compare_counts_changes_per_category() -> None:
    base = [{**line("a", True), "category": "x"}, {**line("b", False), "category": "y"},
            {**line("c", True), "category": "x"}, line("gone", True)]
    new = [{**line("a", False, answer="no"), "category": "x"}, {**line("b", True), "category": "y"},
           {**line("c", False, answer="no"), "category": "x"}]
    c = compare(new, base)
    assert {name: (k.regressions, k.improvements) for name, k in c.categories.items()} == \
        {"x": (2, 0), "y": (0, 1), UNCATEGORISED: (0, 0)}  # "gone" counts under its base line's category
    assert (c.base.categories["x"].correct, c.new.categories["x"].correct) == (2, 0)
    data = c.to_json()
    assert data["categories"]["x"] == {"regressions": 2, "improvements": 0}
    assert data["new"]["categories"]["y"]["correct"] == 1 and data["base"]["categories"]["y"]["correct"] == 0


def test_report_has_a_row_of_figures_per_category() -> None:
    lines = [{**line("a", True), "category": "single_tool"}, {**line("b", False, answer="no"), "category": "dependent"},
             line("c", True)]
    html = render("t", summarise(lines), lines)
    assert "id=categories" in html
    for name in ("single_tool", "dependent", UNCATEGORISED):
        assert f"<tr data-category='{name}'><th>{name}</th>" in html
    row = html.split("<tr data-category='dependent'>")[1].split("</tr>")[0]
    assert "data-figure='questions'>1<" in row and "data-figure='success rate'>0.0%<" in row
    assert "data-figure='statuses'>succeeded 1<" in row and "data-figure='turns p95'>2<" in row
    assert "<p id=statuses>runs by status: succeeded 3</p>" in html
    assert "<td>dependent</td>" in html  # the per-question table names each line's category
    base = [{**line("a", True), "category": "single_tool"}, {**line("b", True), "category": "dependent"}]
    diff = render("t", summarise(lines), lines, compare(lines, base))
    row = diff.split("<tr data-category='dependent'>")[1].split("</tr>")[0]
    assert "data-figure='base success rate'>100.0%<" in row and "data-figure='regressions'>1<" in row
    assert "data-figure='base success rate'>–<" in diff.split(f"<tr data-category='{UNCATEGORISED}'>")[1]


def test_bundled_lines_each_have_a_category_of_the_articles_list() -> None:
    items = [json.loads(t) for t in (ROOT / "worker/data/eval_set.jsonl").read_text().splitlines()]
    assert all(check_category(i["category"]) in BUNDLED_CATEGORIES for i in items), \
        [i["id"] for i in items if i.get("category") not in BUNDLED_CATEGORIES]
    found = {i["category"] for i in items}
    assert found == set(BUNDLED_CATEGORIES)  # every kind of question the second article asks for
    # the stub makes one tool call per independent part of a question: a multi-part one is never single_tool
    def multi_part(question: str) -> bool:
        return question.count(" and ") >= 2 or re.search(r"\band (?:what|who|when|how)\b", question) is not None

    assert not [i["id"] for i in items if i["category"] == "single_tool" and multi_part(i["question"])]
    assert sum(i["category"] == "multi_tool" and multi_part(i["question"]) for i in items) >= 10
