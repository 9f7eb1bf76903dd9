"""End to end: real redis-server, real `reactq worker` processes, the real api_stub over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures_cluster import Cluster

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parent.parent / "worker" / "data" / "sample_batch.jsonl"


def read_results(path: Path) -> dict[str, dict]:
    return {line["id"]: line for line in map(json.loads, path.read_text().splitlines())}


def expected_answers() -> dict[str, str]:
    return {item["id"]: item["expected"] for item in map(json.loads, SAMPLE.read_text().splitlines())}


@pytest.mark.parametrize("mode", ["tools", "text"])
def test_sample_batch_end_to_end(cluster: Cluster, tmp_path: Path, mode: str) -> None:
    cluster.start_worker(REACTQ_MODE=mode)
    out = tmp_path / "out.jsonl"
    result = cluster.reactq("batch", str(SAMPLE), "--out", str(out), REACTQ_MODE=mode)
    assert result.returncode == 0, result.stderr
    results = read_results(out)
    expected = expected_answers()
    assert set(results) == set(expected)
    for qid, want in expected.items():
        line = results[qid]
        assert line["status"] == "succeeded", line
        assert want.lower() in line["answer"].lower(), line
        assert line["usage"]["prompt_tokens"] > 0 and line["usage"]["completion_tokens"] > 0
    if mode == "tools":  # the multi-part questions were answered with parallel tool calls in one step
        parallel = [r for r in results.values() if r["steps"] == 2 and ";" in (r["answer"] or "")]
        assert parallel, "expected at least one run answered with parallel calls in one step"
