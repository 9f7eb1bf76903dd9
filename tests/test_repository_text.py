"""The repository stands on its own: nothing in it points outside it (`../shared`), and no rule is explained by
an issue number (the reason is said where the rule is, or in docs/decisions/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ISSUE_NUMBER = re.compile(r"\bissues? ?#?\d+|\(item \d+(\.\d+)?\)", re.I)
OUTSIDE = re.compile(r"\.\./shared\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if Path(n).suffix in {".py", ".md", ".yml", ".yaml", ".sh", ".toml", ".j2",
                                                              ".html", ".txt", ".lua", ".json"}]


def offending_lines(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if pattern.search(line) and "github.com" not in line and "encode/httpcore#" not in line:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def test_nothing_points_outside_the_repository() -> None:
    assert not offending_lines(OUTSIDE)


def test_no_rule_is_explained_by_an_issue_number() -> None:
    assert not offending_lines(ISSUE_NUMBER)


def test_the_checks_see_what_they_look_for() -> None:
    assert ISSUE_NUMBER.search("as issue 19 asks") and ISSUE_NUMBER.search("(item 3)")
    assert OUTSIDE.search("see ../shared/DESIGN.md") and not ISSUE_NUMBER.search("an issue with 3 runs")
