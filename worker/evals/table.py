"""An evaluation's lines on disk: the dataset's expected answers and the results files, in a private
temporary SQLite database, so scoring, summaries, comparisons and reports read them back one line at a
time with memory flat in the set's size (SQLite's page cache is bounded, ~2 MB; the rest stays on disk).

- `dataset(id, pos, expected, match, category)`: one row per good dataset line, `pos` its order;
  `expected` is JSON (a string or a list) or NULL for a line without one; `category` NULL for none.
- `results(src, id, pos, line)`: one row per id of a results file (`src` is `new` or `base`; a later
  line of the same id replaces an earlier one), re-scored on load against the dataset's expectations
  when the dataset has the id (so a plain `reactq batch` output can be a `--compare` baseline), and
  given the dataset's category (the dataset decides a question's category, not an old results file).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from .compare import Pair
from .fields import answer_object, field_scores, object_score
from .scoring import MatchMode, matches

__all__ = ["BASE", "NEW", "EvalTable", "Expected", "rescored"]

NEW, BASE = "new", "base"
Expected = tuple[str | list[str] | dict[str, Any], MatchMode]
_SCHEMA = """
CREATE TABLE dataset (id TEXT PRIMARY KEY, pos INTEGER NOT NULL, expected TEXT, match TEXT, category TEXT);
CREATE TABLE results (src TEXT NOT NULL, id TEXT NOT NULL, pos INTEGER NOT NULL, line TEXT NOT NULL,
                      PRIMARY KEY (src, id));
CREATE INDEX results_pos ON results (src, pos);
"""


def rescored(line: dict[str, Any], expected: Expected | None) -> dict[str, Any]:
    """The line scored against `expected`; without one it keeps its own verdict."""
    if expected is None:
        return line
    want, mode = expected
    if isinstance(want, dict):  # match "fields": the output object, field by field (evals/fields.py)
        got = line["output"] if line.get("output") is not None else answer_object(line.get("answer"))
        scores = field_scores(got, want)
        ok = line.get("status") == "succeeded" and all(v == 1.0 for v in scores.values())
        return {**line, "expected": want, "match": mode.value, "correct": ok, "field_scores": scores,
                "score": object_score(scores)}
    ok = line.get("status") == "succeeded" and matches(line.get("answer"), want, mode)
    scored = {**line, "expected": want, "match": mode.value, "correct": ok}
    if line.get("partial"):  # a best-effort answer at a limit is never correct; whether it matched is told apart
        scored["partial_correct"] = matches(line.get("answer"), want, mode)
    return scored


class EvalTable:
    """Open with `with EvalTable() as table:`; the database file is deleted when it is closed."""

    def __init__(self) -> None:
        self._db: sqlite3.Connection | None = None
        self._positions = 0

    def __enter__(self) -> EvalTable:
        self._db = sqlite3.connect("")  # "": a private on-disk temporary database, removed on close
        self._db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + _SCHEMA)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("EvalTable used outside its `with` block")
        return self._db

    # --- the dataset -------------------------------------------------------------------------------

    def add_question(self, line_id: str, expected: Expected | None, category: str | None = None) -> None:
        """A good dataset line, in the dataset's order."""
        want, mode = (None, None) if expected is None else (json.dumps(expected[0]), expected[1].value)
        self.db.execute("INSERT OR REPLACE INTO dataset VALUES (?, ?, ?, ?, ?)",
                        (line_id, self._positions, want, mode, category))
        self._positions += 1

    @property
    def questions(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM dataset").fetchone()[0])

    @property
    def scorable(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM dataset WHERE expected IS NOT NULL").fetchone()[0])

    def expected(self, line_id: str) -> Expected | None:
        return self.question(line_id)[1]

    def category(self, line_id: str) -> str | None:
        return self.question(line_id)[2]

    def question(self, line_id: str) -> tuple[bool, Expected | None, str | None]:
        """(whether the dataset has the id, its expected answer, its category)."""
        row = self.db.execute("SELECT expected, match, category FROM dataset WHERE id = ?", (line_id,)).fetchone()
        if row is None:
            return False, None, None
        return True, (None if row[0] is None else (json.loads(row[0]), MatchMode(row[1]))), row[2]

    # --- results files -----------------------------------------------------------------------------

    def load_results(self, src: str, path: Path) -> None:
        """Every readable line of a results file (unreadable ones are skipped, as `reactq batch` does on
        resume), re-scored against the dataset."""
        with path.open(encoding="utf-8") as f:
            for pos, text in enumerate(f):
                try:
                    line = json.loads(text)
                except ValueError:
                    continue
                if not isinstance(line, dict) or "id" not in line:
                    continue
                line_id = str(line["id"])
                known, expected, category = self.question(line_id)
                line = rescored(line, expected)
                if known:
                    line = {**line, "category": category}
                self.db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)",
                                (src, line_id, pos, json.dumps(line, ensure_ascii=False)))

    def lines(self, src: str = NEW) -> Iterator[dict[str, Any]]:
        """The results of the dataset's questions, in dataset order (questions with no result left out)."""
        query = ("SELECT r.line FROM dataset d JOIN results r ON r.src = ? AND r.id = d.id ORDER BY d.pos")
        for (text,) in self.db.execute(query, (src,)):
            yield json.loads(text)

    def all_lines(self, src: str) -> Iterator[dict[str, Any]]:
        """Every line of a results file, in the file's order (the baseline's summary counts them all)."""
        for (text,) in self.db.execute("SELECT line FROM results WHERE src = ? ORDER BY pos", (src,)):
            yield json.loads(text)

    def pairs(self) -> Iterator[Pair]:
        """(base, new) per question: the dataset's questions answered now, in dataset order, then the
        baseline's other questions in its file's order."""
        paired = ("SELECT b.line, n.line FROM dataset d JOIN results n ON n.src = ? AND n.id = d.id "
                  "LEFT JOIN results b ON b.src = ? AND b.id = d.id ORDER BY d.pos")
        for base, new in self.db.execute(paired, (NEW, BASE)):
            yield (None if base is None else json.loads(base)), json.loads(new)
        only_base = ("SELECT b.line FROM results b WHERE b.src = ? AND NOT EXISTS (SELECT 1 FROM dataset d "
                     "JOIN results n ON n.src = ? AND n.id = d.id WHERE d.id = b.id) ORDER BY b.pos")
        for (base,) in self.db.execute(only_base, (BASE, NEW)):
            yield json.loads(base), None
