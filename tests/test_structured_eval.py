"""`reactq eval` on structured answers (pure parts): an expected object compared with the run's `output`
field by field, each field scored, the line's score and verdict, the summary's per-field means, and the
dataset lines that carry an expected object (the whole path: tests/test_demo.py, tests/test_structured_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.config import Settings
from worker.evals.fields import field_scores, object_score
from worker.evals.scoring import MatchMode, check_expected
from worker.evals.summary import summarise
from worker.evals.table import rescored
from worker.service.batch_input import iter_input

SCHEMA = {"type": "object", "properties": {"value": {"type": "number"}}}


def test_each_expected_field_is_scored_by_its_kind():
    output = {"value": 395.0, "name": "  jane   AUSTEN.", "ok": True, "tags": ["a", "B"], "none": None,
              "address": {"city": "Paris", "zip": "75001"}, "extra": "not scored"}
    expected = {"value": 395, "name": "Jane Austen", "ok": True, "tags": ["A", "b"], "none": None,
                "address": {"city": "paris", "zip": 75002}, "missing": 1}
    assert field_scores(output, expected) == {"value": 1.0, "name": 1.0, "ok": 1.0, "tags": 1.0, "none": 1.0,
                                              "address.city": 1.0, "address.zip": 0.0, "missing": 0.0}


@pytest.mark.parametrize(("got", "want"), [(1, True), (True, 1), (0, False), (None, 0), ("1", True),
                                           ({"a": 1}, "1"), ([1], 1), (396, 395)])
def test_values_of_other_kinds_or_other_values_score_zero(got, want):
    assert field_scores({"f": got}, {"f": want}) == {"f": 0.0}


def test_no_object_scores_every_field_zero():
    assert field_scores(None, {"a": 1, "b": {"c": 2}}) == {"a": 0.0, "b.c": 0.0}
    assert object_score({"a": 1.0, "b": 0.0, "c": 0.0}) == 0.3333 and object_score({}) == 1.0


def test_a_results_line_is_scored_field_by_field():
    line = {"id": "s1", "status": "succeeded", "answer": '{"value": 395, "unit": "m"}',
            "output": {"value": 395, "unit": "m"}}
    scored = rescored(line, ({"value": 395, "unit": "km"}, MatchMode.FIELDS))
    assert scored["field_scores"] == {"value": 1.0, "unit": 0.0} and scored["score"] == 0.5
    assert scored["correct"] is False and scored["match"] == "fields"
    right = rescored(line, ({"value": 395}, MatchMode.FIELDS))
    assert right["correct"] is True and right["score"] == 1.0
    failed = rescored({**line, "status": "failed"}, ({"value": 395}, MatchMode.FIELDS))
    assert failed["correct"] is False and failed["field_scores"] == {"value": 1.0}
    # a line written without `output` (an older results file, a --compare baseline): its answer is read
    older = rescored({"id": "s1", "status": "succeeded", "answer": '{"value": 395}'}, ({"value": 395},
                                                                                       MatchMode.FIELDS))
    assert older["correct"] is True


def test_the_summary_gives_each_fields_mean_score():
    lines = [rescored({"id": str(i), "status": "succeeded", "output": out}, ({"a": 1, "b": 2}, MatchMode.FIELDS))
             for i, out in enumerate(({"a": 1, "b": 2}, {"a": 1, "b": 3}, {"a": 0}, {"a": 1, "b": 2}))]
    summary = summarise(lines)
    assert summary.field_scores == {"a": 0.75, "b": 0.5} and summary.correct == 2
    assert summary.to_json()["field_scores"] == {"a": 0.75, "b": 0.5}
    assert summarise([{"id": "x", "status": "succeeded", "correct": True}]).field_scores == {}


@pytest.mark.parametrize(("expected", "mode", "problem"), [
    ({"a": 1}, "fields", None),
    ({"a": 1}, "contains", "an object `expected` goes with match 'fields'"),
    ("42", "fields", "an object `expected` goes with match 'fields'"),
])
def test_check_expected_pairs_objects_with_fields(expected, mode, problem):
    found = check_expected(expected, mode)
    assert (found is None) if problem is None else (found is not None and found.startswith(problem))


def test_dataset_lines_with_an_expected_object(tmp_path: Path):
    infile = tmp_path / "set.jsonl"
    infile.write_text("\n".join(json.dumps(line) for line in (
        {"id": "a", "question": "q", "output_schema": SCHEMA, "expected": {"value": 1}},
        {"id": "b", "question": "q", "expected": {"value": 1}},
        {"id": "c", "question": "q", "output_schema": SCHEMA, "expected": {"value": 1}, "match": "exact"},
    )) + "\n")
    parsed = list(iter_input(infile, Settings(), None, None))
    first = parsed[0]
    assert getattr(first, "expected", None) == ({"value": 1}, MatchMode.FIELDS)
    assert str(parsed[1]) == "line 2: an object `expected` needs an `output_schema` (it is compared with the output)"
    assert str(parsed[2]).startswith("line 3: an object `expected` goes with match 'fields'")
