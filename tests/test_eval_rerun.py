"""A rerun says what it adopts, and never returns stale results: `reactq eval` and `reactq
batch` for the same `--out` adopt the earlier invocation's unfinished runs, and its finished ones only
when it was interrupted before writing them; a completed invocation's runs are never adopted (a deleted
output file starts over), and `--fresh` starts over. Real redis-server, `reactq worker` processes, the
api_stub and the real CLI."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_stub import StubControl
from tests.waiting import wait_for
from worker.runtime.context import Runtime

pytestmark = pytest.mark.integration

BUNDLED = ROOT / "worker" / "data" / "eval_set.jsonl"
QUESTIONS = 4


def _subset(tmp_path: Path) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("".join(t + "\n" for t in BUNDLED.read_text().splitlines()[:QUESTIONS]))
    return path


def _said(result: subprocess.CompletedProcess[str] | str) -> str:
    text = result if isinstance(result, str) else result.stderr
    return " ".join(text.split())


def _run_ids(out: Path) -> dict[str, str]:
    return {line["id"]: line["run_id"] for line in map(json.loads, out.read_text().splitlines())}


def test_an_eval_rerun_after_a_failed_run_and_a_deleted_file_runs_anew(cluster: Cluster, tmp_path: Path) -> None:
    """The LLM endpoint was unreachable and every question failed; with it fixed and the
    results file deleted, the rerun runs every question again, saying why it adopts nothing."""
    dataset, out = _subset(tmp_path), tmp_path / "results.jsonl"
    broken = cluster.start_worker(queues="steps", concurrency=4, REACTQ_LLM_BASE_URL="http://127.0.0.1:9/v1",
                                  REACTQ_LLM_MAX_RETRIES="0", REACTQ_LLM_CIRCUIT_BASE_S="0.5")
    # an unreachable endpoint is waited for until the run's deadline: 3 s here
    failed = cluster.reactq("eval", str(dataset), "--out", str(out), "--json", REACTQ_RUN_DEADLINE_S="3")
    assert json.loads(failed.stdout)["summary"]["correct"] == 0, failed.stderr
    first = _run_ids(out)
    cluster.kill(broken)

    cluster.start_worker(queues="steps", concurrency=4)
    out.unlink()
    again = cluster.reactq("eval", str(dataset), "--out", str(out), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["summary"]["correct"] == QUESTIONS, again.stdout
    assert f"{QUESTIONS} finished run(s) of the earlier invocation" in _said(again), again.stderr
    assert "it completed" in _said(again) and "submitted anew" in _said(again)
    assert not set(first.values()) & set(_run_ids(out).values())  # no old run was reused

    kept = cluster.reactq("eval", str(dataset), "--out", str(out))  # the file kept: nothing runs
    assert f"0 runs to follow, {QUESTIONS} already in" in _said(kept) and "earlier invocation" not in _said(kept)


def _batch_of(cluster: Cluster, out: Path) -> dict[str, str]:
    """The record of the last batch for `out`, once its submission is over."""
    store = Runtime(cluster.settings()).store
    digest = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:24]

    def submitted() -> dict[str, str]:
        batch_id = store.batches.for_file(digest)
        info = store.batches.info(batch_id) if batch_id else {}
        return {**info, "id": batch_id or ""} if "size" in info else {}

    return wait_for(f"the batch for {out} to be submitted", submitted, 120)


def _interrupt(cluster: Cluster, batch: subprocess.Popen[str], out: Path, earlier: str | None = None) -> str:
    """SIGINT (Ctrl-C) to a `reactq batch` once its submission is over."""
    wait_for("a new batch", lambda: _batch_of(cluster, out)["id"] != earlier, 120)
    batch.send_signal(signal.SIGINT)
    said = cluster.finish_batch(batch, timeout=120)
    assert batch.returncode == 130, said
    return said


def test_an_interrupted_batch_is_adopted_and_said_so_and_fresh_starts_over(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path
) -> None:
    infile = tmp_path / "in.jsonl"
    infile.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?"}) + "\n"
                              for i in range(QUESTIONS)))
    out = tmp_path / "out.jsonl"

    # no worker: the first invocation submits, then is interrupted with every run queued
    _interrupt(cluster, cluster.start_batch(infile, out), out)
    first = _batch_of(cluster, out)
    store = Runtime(cluster.settings()).store
    run_ids = [i for chunk in store.batches.iter_run_ids(first["id"]) for i in chunk]
    assert len(run_ids) == QUESTIONS and out.read_text() == ""

    # a rerun adopts the queued runs, saying so; interrupted again before anything finished
    said = _interrupt(cluster, cluster.start_batch(infile, out), out, first["id"])
    assert f"adopted {QUESTIONS} run(s) of the earlier invocation" in _said(said), said
    assert f"(batch {first['id']}, interrupted): {QUESTIONS} queued" in _said(said), said

    # the runs finish in the background, their results unwritten: a rerun adopts them, finished
    cluster.start_worker(queues="steps", concurrency=4)
    for run_id in run_ids:
        assert cluster.wait_for_run(run_id)["status"] == "succeeded"
    calls = stub_control.stats()["completions"]
    collected = cluster.reactq("batch", str(infile), "--out", str(out))
    assert collected.returncode == 0, collected.stderr
    assert f"(batch {_batch_of(cluster, out)['id']}" not in _said(collected)  # it names the earlier batch
    assert f"adopted {QUESTIONS} run(s)" in _said(collected) and f"{QUESTIONS} succeeded" in _said(collected)
    assert sorted(_run_ids(out).values()) == sorted(run_ids)
    assert stub_control.stats()["completions"] == calls  # nothing ran again

    # --fresh starts over: the file emptied, every line submitted anew, nothing adopted
    fresh = cluster.reactq("batch", str(infile), "--out", str(out), "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert "--fresh: no run of the earlier invocation" in _said(fresh) and not re.search(r"adopted \d", _said(fresh))
    again = _run_ids(out)
    assert len(out.read_text().splitlines()) == QUESTIONS and not set(again.values()) & set(run_ids)
    assert stub_control.stats()["completions"] > calls


def test_a_finished_run_whose_result_was_written_is_not_adopted_after_an_interruption(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Interrupted after writing some results: a rerun with the file deleted runs those lines anew, and
    adopts the runs whose results were never written."""
    infile = tmp_path / "in.jsonl"
    infile.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} * 3?"}) + "\n"
                              for i in range(QUESTIONS)))
    out = tmp_path / "out.jsonl"
    cluster.start_worker(queues="steps", concurrency=4)
    done = cluster.reactq("batch", str(infile), "--out", str(out))
    assert done.returncode == 0, done.stderr
    written = _run_ids(out)
    store = Runtime(cluster.settings()).store
    batch = _batch_of(cluster, out)
    assert batch.get("complete") == "1" and batch.get("written") == str(QUESTIONS)

    # as if interrupted after writing two results: the record says two were written, not all
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    client.hdel(f"reactq:batch:{batch['id']}", "complete")
    client.close()
    store.batches.mark_written(batch["id"], 2)
    shown = store.batches.finished_range(batch["id"], 0, 2)
    out.unlink()
    rerun = cluster.reactq("batch", str(infile), "--out", str(out))
    assert rerun.returncode == 0, rerun.stderr
    assert "adopted 2 run(s)" in _said(rerun) and "2 succeeded" in _said(rerun), rerun.stderr
    assert "2 finished run(s) of the earlier invocation" in _said(rerun)
    assert "their results had been written" in _said(rerun)
    now = _run_ids(out)
    assert set(now) == set(written)
    assert {i for i, r in now.items() if r == written[i]} == {i for i, r in written.items() if r not in shown}
