"""`reactq eval` end to end: real redis-server, real `reactq worker` processes, the real api_stub; the
HTML report opened in headless Chromium (Debian's `chromium`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures_cluster import ROOT, Cluster

pytestmark = pytest.mark.integration

BUNDLED = ROOT / "worker" / "data" / "eval_set.jsonl"


def dump_dom(html: Path, tmp_path: Path) -> str:
    """The DOM headless Chromium builds from the file, offline (no network features)."""
    binary = shutil.which("chromium")
    assert binary is not None, "chromium is not on PATH (apt-get install chromium)"
    done = subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", html.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_bundled_set_scores_fully_resumes_compares_and_reports(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_worker()
    results, report = tmp_path / "results.jsonl", tmp_path / "report.html"
    done = cluster.reactq("eval", str(BUNDLED), "--out", str(results), "--report", str(report), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    summary = data["summary"]
    total = len(BUNDLED.read_text().splitlines())
    assert summary["questions"] == total and summary["correct"] == total, summary["failures"]
    assert summary["turns_mean"] >= 2 and summary["tokens_per_question"] > 0 and summary["usd_per_question"] > 0
    assert summary["latency_p95_s"] >= summary["latency_p50_s"] > 0
    lines = [json.loads(t) for t in results.read_text().splitlines()]
    assert len(lines) == total and all(line["correct"] and line["expected"] is not None for line in lines)
    # every figure per category: each line's category (from the set), and each category's summary
    dataset = [json.loads(t) for t in BUNDLED.read_text().splitlines()]
    wanted = {d["id"]: d["category"] for d in dataset}
    assert {line["id"]: line["category"] for line in lines} == wanted
    categories = list(dict.fromkeys(wanted.values()))
    assert list(summary["categories"]) == categories and len(categories) >= 2
    for name, figures in summary["categories"].items():
        size = sum(c == name for c in wanted.values())
        assert figures["questions"] == figures["correct"] == size and figures["statuses"] == {"succeeded": size}
        assert figures["tokens_per_question"] > 0 and figures["usd_per_question"] > 0
        assert figures["turns_mean"] >= (1 if name == "no_tool" else 2)  # a direct answer is one step
        assert figures["latency_p95_s"] >= figures["latency_p50_s"] > 0
    assert summary["statuses"] == {"succeeded": total}

    # the same command again runs nothing and scores the whole file
    again = cluster.reactq("eval", str(BUNDLED), "--out", str(results))
    assert again.returncode == 0, again.stderr
    assert f"0 runs to follow, {total} already in" in again.stderr
    assert f"{total}/{total} (100.0%)" in again.stdout
    table = again.stdout.split("per category")[1].split("worst questions")[0]
    for name in categories:
        size = sum(c == name for c in wanted.values())
        assert f"│ {name} " in table and f"{size}/{size}" in table, table

    # a change for the worse (one step only) on a few questions: each is flagged as a regression
    subset = tmp_path / "subset.jsonl"
    subset.write_text("".join(t + "\n" for t in BUNDLED.read_text().splitlines()[:4]))
    worse = cluster.reactq("eval", str(subset), "--out", str(tmp_path / "worse.jsonl"), "--compare", str(results),
                           "--json", REACTQ_MAX_STEPS="1")
    assert worse.returncode == 0, worse.stderr
    comparison = json.loads(worse.stdout)["comparison"]
    ids = [json.loads(t)["id"] for t in subset.read_text().splitlines()]
    assert comparison["regressions"] == ids
    assert comparison["new"]["correct"] == 0 and comparison["base"]["correct"] == total
    failures = json.loads(worse.stdout)["summary"]["failures"]
    assert [(f["status"], f["count"]) for f in failures] == [("max_steps", 4)]
    first = [d["category"] for d in dataset[:4]]
    assert set(comparison["categories"]) == set(categories)  # the baseline's other questions count too
    assert {name: c["regressions"] for name, c in comparison["categories"].items()} == \
        {name: first.count(name) for name in categories}
    worse_figures = json.loads(worse.stdout)["summary"]["categories"][first[0]]
    assert worse_figures["statuses"] == {"max_steps": first.count(first[0])}

    text = cluster.reactq("eval", str(subset), "--out", str(tmp_path / "worse.jsonl"), "--compare", str(results),
                          "--report", str(tmp_path / "diff.html"))
    assert "4 regression(s)" in text.stdout and "per category, compared" in text.stdout

    # a line with a bad category is refused by its line number; the others run
    bad = tmp_path / "bad.jsonl"
    bad.write_text(BUNDLED.read_text().splitlines()[0] + "\n"
                   + json.dumps({"id": "bad", "question": "What is 1 + 1?", "expected": "2", "category": "no spaces"})
                   + "\n")
    refused = cluster.reactq("eval", str(bad), "--out", str(tmp_path / "bad.results.jsonl"), "--json")
    assert refused.returncode == 1, refused.stderr
    assert "line 2: category: Value error, a category is 1 to 40 letters" in refused.stderr.replace("\n", " ")
    assert json.loads(refused.stdout)["summary"]["questions"] == 1

    dom = dump_dom(report, tmp_path)
    assert "id=\"turns-histogram\"" in dom and "id=\"tokens-per-question\"" in dom
    assert dom.count("class=\"tokens\"") == total
    assert f"data-figure=\"correct\">{total}</td>" in dom and ">100.0%</td>" in dom
    bars = sum(int(part.split("\"")[0]) for part in dom.split("data-count=\"")[1:])
    assert bars == total  # the histogram accounts for every run
    for name in categories:
        size = sum(c == name for c in wanted.values())
        row = dom.split(f"<tr data-category=\"{name}\">")[1].split("</tr>")[0]
        assert f"data-figure=\"questions\">{size}</td>" in row and f"data-figure=\"correct\">{size}</td>" in row
        assert "data-figure=\"success rate\">100.0%</td>" in row and f"succeeded {size}" in row
    diff_dom = dump_dom(tmp_path / "diff.html", tmp_path)
    assert diff_dom.count("data-change=\"regression\"") == 4 and "4 regression(s)" in diff_dom
    row = diff_dom.split(f"<tr data-category=\"{first[0]}\">")[1].split("</tr>")[0]
    assert "data-figure=\"base success rate\">100.0%</td>" in row
    assert f"data-figure=\"regressions\">{first.count(first[0])}</td>" in row
