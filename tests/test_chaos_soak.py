"""A small chaos soak (tests/chaos.py; bench/chaos_soak.py runs thousands): a flaky provider, step workers
SIGKILLed and replaced, Redis SIGKILLed and restarted twice, `reactq batch` resumed as a user would, and
every run still ends with its right answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos import SoakConfig, soak

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_chaos_soak_loses_no_run_and_answers_each_right(sandbox_image: str, tmp_path: Path) -> None:
    # slow calls and few threads, so that a few worker kills fall inside the batch even on a quiet machine
    config = SoakConfig(runs=200, concurrency=4, latency_ms=500, latency_jitter_ms=200, kill_every_s=8.0)
    report = soak(config, tmp_path, sandbox_image)
    print(json.dumps(report.summary(), indent=1))  # the figures, with -s
    kinds = [f.kind for f in report.faults]
    assert kinds.count("redis") == 2 and kinds.count("worker") >= 1, report.faults
    assert report.by_status.get("500") and report.by_status.get("429"), report.by_status
    assert report.python_runs > 0
    assert report.lost == [], (report.lost[:20], report.invocations)
    assert report.wrong == [], report.wrong[:5]
    assert report.duplicate_lines == 0
