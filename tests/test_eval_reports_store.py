"""The eval report store (worker/store/eval_reports.py) on a real redis-server, and `reactq eval --report`
storing its report there (real workers and the api_stub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import ROOT, Cluster
from worker.store import keys
from worker.store.eval_reports import EvalReports, ReportTooLarge, from_settings

BUNDLED = ROOT / "worker" / "data" / "eval_set.jsonl"


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_saved_reports_are_listed_newest_first_per_tenant_and_read_back(client: redis.Redis) -> None:
    store = EvalReports(client, keep_s=3600, max_bytes=100_000, kept=10)
    html = "<!doctype html><p>" + "row " * 5000 + "</p>"
    store.save("acme", "a" * 32, "first.jsonl", html, {"questions": 3})
    store.save("acme", "b" * 32, "second.jsonl", "<p>2</p>", {"questions": 4})
    store.save("other", "c" * 32, "theirs.jsonl", "<p>3</p>", {"questions": 5})
    listed = store.list("acme")
    assert [r.id for r in listed] == ["b" * 32, "a" * 32] and listed[1].summary == {"questions": 3}
    assert all(r.html is None for r in listed)
    got = store.get("acme", "a" * 32)
    assert got is not None and got.html == html and got.name == "first.jsonl"
    assert len(client.hget(keys.eval_report("acme", "a" * 32), "html") or b"") < len(html) / 10  # compressed
    assert store.get("acme", "c" * 32) is None  # another tenant's
    assert store.get("acme", "../" + "c" * 29) is None  # not an id
    assert 0 < client.ttl(keys.eval_report("acme", "a" * 32)) <= 3600


def test_the_size_cap_refuses_and_the_oldest_beyond_kept_go(client: redis.Redis) -> None:
    store = EvalReports(client, keep_s=3600, max_bytes=2048, kept=2)
    with pytest.raises(ReportTooLarge, match="REACTQ_EVAL_REPORT_MAX_BYTES"):
        store.save("acme", "a" * 32, "big", "x" * 4096, {})
    assert store.list("acme") == []
    for i, c in enumerate("def"):
        store.save("acme", c * 32, f"r{i}", "<p>x</p>", {})
    assert [r.id for r in store.list("acme")] == ["f" * 32, "e" * 32]
    assert not client.exists(keys.eval_report("acme", "d" * 32))
    client.delete(keys.eval_report("acme", "e" * 32))  # expired: dropped from the index when met
    assert [r.id for r in store.list("acme")] == ["f" * 32]
    assert client.zcard(keys.tenant_eval_reports("acme")) == 1


@pytest.mark.integration
def test_eval_report_is_stored_for_the_ui_unless_told_not_to(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_worker()
    subset = tmp_path / "subset.jsonl"
    subset.write_text("\n".join(BUNDLED.read_text().splitlines()[:3]) + "\n")
    report = tmp_path / "report.html"
    done = cluster.reactq("eval", str(subset), "--out", str(tmp_path / "r.jsonl"), "--report", str(report))
    assert done.returncode == 0, done.stderr
    assert "report stored for the UI: /ui/evals/" in done.stderr.replace("\n", "")
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    stored = from_settings(client, cluster.settings()).list("default")
    assert len(stored) == 1 and stored[0].name == "subset.jsonl" and stored[0].summary["questions"] == 3
    got = from_settings(client, cluster.settings()).get("default", stored[0].id)
    assert got is not None and got.html == report.read_text()
    again = cluster.reactq("eval", str(subset), "--out", str(tmp_path / "r2.jsonl"), "--report",
                           str(tmp_path / "r2.html"), "--no-store", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["summary"]["questions"] == 3
    assert len(from_settings(client, cluster.settings()).list("default")) == 1
