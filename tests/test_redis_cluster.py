"""Run state on a real Redis Cluster (REACTQ_REDIS_URL=redis+cluster://), the broker on a Redis of its own.

Six redis-server processes make three primaries with a replica each; the broker is a Sentinel-managed
primary with one replica and three sentinels. A batch runs through real workers while a cluster primary is
SIGKILLed, then the broker's primary: every run is answered right, once, and the model calls repeated stay
bounded. Every key of a run is on its run's shard; nothing of a run is left in its outbox.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from redis.exceptions import RedisClusterException, RedisError

from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import Cluster, state_client
from tests.fixtures_redis_cluster import MASTER, RedisClusterNodes, SentinelBroker
from tests.fixtures_services import RedisServer
from tests.fixtures_stub import StubControl
from tests.test_integration import SAMPLE, assert_all_answered
from tests.test_recovery import batch_under_way
from tests.test_tenancy import tenant_id
from tests.waiting import WaitTimeout, wait_for
from worker.core.models import Run, RunSpec, RunStatus
from worker.store import keys
from worker.store.cluster import ClusterStore, active_count
from worker.store.outbox import Entry, marker, slot_of, split
from worker.store.runs import RunStore

pytestmark = pytest.mark.integration


def test_the_sample_batch_runs_on_a_redis_cluster_python_included(
        cluster: Cluster, redis_cluster: RedisClusterNodes, own_redis: RedisServer, tmp_path: Path) -> None:
    cluster.env["REACTQ_REDIS_URL"] = redis_cluster.url
    cluster.env["REACTQ_BROKER_URL"] = own_redis.url
    cluster.start_worker(queues="steps,sandbox", concurrency=8)
    items = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    infile.write_text("".join(json.dumps({"id": i["id"], "question": i["question"]}) + "\n" for i in items))
    done = cluster.reactq("batch", str(infile), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = assert_all_answered(out, {i["id"]: i["expected"] for i in items})
    state = state_client(redis_cluster.url)
    for line in lines.values():
        run_id = line["run_id"]
        run_keys = list(state.scan_iter(keys.run(run_id) + "*"))
        assert run_keys and {slot_of(k) for k in run_keys} == {slot_of(keys.run(run_id))}
    # each run's outbox is applied right after the commit that finished it (which the CLI may see first)
    wait_for("every outbox applied and no run active",
             lambda: [r["run_id"] for r in lines.values() if state.exists(keys.outbox(r["run_id"]))]
             + ["active"] * active_count(state), 10, until=lambda left: not left)
    assert list(state.scan_iter("reactq:sandbox:{quota}:*"))  # the python runs' quota keys, tagged
    purged = cluster.reactq("purge", "--older-than", "0d", "--json")  # retention scans every primary
    assert json.loads(purged.stdout)["runs"] == len(items), purged.stderr[-2000:]
    assert not list(state.scan_iter("reactq:run:*"))


def test_a_cluster_primary_then_the_broker_primary_killed_mid_batch_lose_nothing(
        cluster: Cluster, redis_cluster: RedisClusterNodes, sentinel_broker: SentinelBroker,
        stub_control: StubControl, tmp_path: Path) -> None:
    cluster.env.update({"REACTQ_REDIS_URL": redis_cluster.url, "REACTQ_BROKER_URL": sentinel_broker.url,
                        "REACTQ_BROKER_SENTINEL_MASTER": MASTER})
    _, batch, _, out, expected = batch_under_way(cluster, stub_control, tmp_path, 300, 8)
    # a primary holding a third of the runs, with their active sets (not the URL's seed node, which new
    # processes need: a deployment names a seed that outlives any one node, such as a Service)
    primaries = [port for port, role in redis_cluster.roles().items() if role == "master"]
    victim = next(port for port in primaries if port != redis_cluster.ports[0])
    slot_key = next(k for k in (f"probe-{i}" for i in range(10_000)) if redis_cluster.primary_of(k) == victim)
    redis_cluster.kill(victim)
    wait_for("a replica to take over the killed primary's slots", lambda: redis_cluster.primary_of(slot_key),
             60, 0.2, until=lambda port: port != victim, ignoring=(RedisClusterException, RedisError))
    try:
        cluster.wait_for_results(out, len(expected) // 2, timeout=180)
    except WaitTimeout:
        batch.kill()
        raise AssertionError(f"the batch stalled; it said: {batch.communicate()[1][-12000:]}") from None
    sentinel_broker.fail_over()
    stderr = cluster.finish_batch(batch, timeout=300)
    assert batch.returncode == 0, stderr[-3000:]
    lines = assert_all_answered(out, expected)
    state = state_client(redis_cluster.url)
    store = RunStore(state)
    # a writer that failed mid-failover left its outbox to the reaper, which applies it before the run leaves
    # the active set
    wait_for("the reaper to apply what the failover interrupted", lambda: active_count(state), 60,
             until=lambda n: n == 0)
    total_steps = 0
    for line in lines.values():
        run = store.load_run(line["run_id"])
        assert run is not None and run.status.value == "succeeded"
        assert [s.index for s in store.load_steps(run.id)] == list(range(run.current_step))  # each step once
        assert not state.exists(keys.outbox(run.id))
        total_steps += run.current_step
    completions = stub_control.stats()["completions"]
    assert total_steps <= completions <= total_steps + 2 * len(expected), (completions, total_steps)


def test_a_writer_that_dies_before_applying_its_outbox_leaves_it_to_the_next_and_nothing_is_applied_twice(
        redis_cluster: RedisClusterNodes, monkeypatch: pytest.MonkeyPatch) -> None:
    state = state_client(redis_cluster.url)
    store = RunStore(state)
    run = Run(spec=RunSpec(question="What is 6 * 7?", batch_id="b1"))
    store.submissions.create_runs([run], batch_id="b1")
    assert state.zscore(keys.active_runs(run.id), run.id) is not None
    others = ClusterStore(state)  # counted by the reaper's pass over the 4,096 sets, read by every process
    assert others.active_count() == 0 and others.count_active(30) == 1 and others.active_count() == 1
    assert state.sismember(keys.tenant_inflight("default"), run.id)

    def dies(run_id: str, raws: list[bytes]) -> dict[int, list[object]]:
        raise SystemExit("the worker died right after its commit")

    monkeypatch.setattr(store.outbox, "apply", dies)
    with pytest.raises(SystemExit):
        store.finish(run.id, RunStatus.FAILED, "stopped")
    monkeypatch.undo()
    # the run's own shard has it all: ended, and the writes for other shards waiting in its outbox
    assert store.load_run(run.id).status is RunStatus.FAILED  # type: ignore[union-attr]
    [entry] = state.lrange(keys.outbox(run.id), 0, -1)
    assert state.hget(keys.batch("b1"), "status:failed") is None and state.llen(keys.batch_done("b1")) == 0
    assert state.zscore(keys.active_runs(run.id), run.id) is not None  # still found by the reaper

    assert store.outbox.drain(run.id) == 1  # what the reaper does with a stale run
    assert state.hget(keys.batch("b1"), "status:failed") == b"1" and state.llen(keys.batch_done("b1")) == 1
    assert not state.sismember(keys.tenant_inflight("default"), run.id)
    assert state.zscore(keys.active_runs(run.id), run.id) is None and not state.exists(keys.outbox(run.id))
    store.outbox.apply(run.id, [entry])  # a second writer that read the same entry before it went
    assert state.hget(keys.batch("b1"), "status:failed") == b"1" and state.llen(keys.batch_done("b1")) == 1


def test_outbox_entries_and_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_hash_tags", True)
    entry = Entry(3, [("HINCRBY", "reactq:tenant:{t}:usage", "prompt_tokens", 5)], last=False)
    assert Entry.decode(entry.encode()) == entry
    assert marker("reactq:batch:{b1}:done") == "reactq:applied:{b1}"
    assert slot_of(marker("reactq:active")) == slot_of("reactq:active")  # an untagged key's marker is on its slot
    run_id = "abc0123456789abcdef0123456789abc"
    going_on = [("RPUSH", keys.steps(run_id), "x"), ("ZADD", keys.active_runs(run_id), 1, run_id)]
    assert split(run_id, going_on) == (going_on, [])  # a step that does not end the run: one script, no outbox
    ending = [("ZREM", keys.active_runs(run_id), run_id), ("SREM", keys.tenant_inflight("t"), run_id),
              ("DEL", keys.lease(run_id))]
    local, remote = split(run_id, ending)  # the run leaves the reaper's view once the rest is applied
    assert local == [ending[2]] and remote == [ending[1], ending[0]]


def test_the_api_serves_runs_from_a_redis_cluster(cluster: Cluster, redis_cluster: RedisClusterNodes,
                                                  own_redis: RedisServer) -> None:
    cluster.env["REACTQ_REDIS_URL"] = redis_cluster.url
    cluster.env["REACTQ_BROKER_URL"] = own_redis.url
    cluster.start_worker(queues="steps", concurrency=4)
    key = make_key(cluster, "acme", plan="standard", via_cli=True)
    api = start_api(cluster)
    try:
        client = api.client(key)
        created = client.post("/v1/runs", json={"question": "What is 6 * 7?"})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        with client.stream("GET", f"/v1/runs/{run_id}/events") as events:  # the asyncio client's stream reads
            kinds = [line.split(":", 1)[1].strip() for line in events.iter_lines() if line.startswith("event:")]
        assert kinds[0] == "queued" and kinds[-1] == "finished", kinds
        run = client.get(f"/v1/runs/{run_id}").json()
        assert run["status"] == "succeeded" and run["answer"] == "42", run
        listed = client.get("/v1/runs").json()
        assert [r["run_id"] for r in listed["runs"]] == [run_id], listed
        state = state_client(redis_cluster.url)
        usage = keys.tenant_usage(tenant_id(cluster, "acme"))
        # through the outbox, which the worker applies right after the commit the API already shows
        wait_for("the tenant's usage on its own shard", lambda: state.hget(usage, "prompt_tokens"), 10)
    finally:
        api.stop()


def test_on_a_cluster_each_run_tenant_batch_and_model_keeps_its_keys_on_one_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert keys.run("r1") == "reactq:run:r1" and keys.tenant("t") == "reactq:tenant:t"  # a single Redis: as ever
    monkeypatch.setattr(keys, "_hash_tags", True)
    families = {
        "run": [keys.run("r1"), keys.steps("r1"), keys.events("r1"), keys.events_compacted("r1"), keys.reply("r1", 0),
                keys.tool_results("r1", 0), keys.sandbox_dispatch("r1", 0, "c"), keys.sandbox_pending("r1", 0),
                keys.lease("r1"), keys.outbox("r1"), keys.step_taken("r1"), keys.sandbox_result("r1", 0, "c"),
                keys.approval_counted("r1", 0, "c"), keys.reaper_suspect("r1"), keys.active_runs("r1")],
        "tenant": [keys.tenant("t"), keys.tenant_keys("t"), keys.tenant_runs("t"), keys.tenant_inflight("t"),
                   keys.tenant_spend("t", "d:2026-12-06"), keys.tenant_spend("t", "m:2026-12"), keys.tenant_usage("t"),
                   keys.tenant_submissions("t", 1), keys.tenant_submitted("t", 1), keys.tenant_streams("t"),
                   keys.tenant_webhook("t"), keys.tenant_deliveries("t"), keys.tenant_batches("t"),
                   keys.tenant_eval_reports("t"), keys.eval_report("t", "e"), keys.tool_cache("t", "x", "d")],
        "batch": [keys.batch("b"), keys.batch_runs("b"), keys.batch_done("b"), keys.batch_ids("b"),
                  keys.batch_webhook_sent("b")],
        "model": [keys.llm_limit("m", "rpm"), keys.llm_limit("m", "tpm"), keys.llm_window("m"), keys.llm_cooldown("m"),
                  keys.llm_circuit("m"), keys.llm_in_flight("m"), keys.llm_failures("m")],
        "webhook slots": [keys.webhook_tenant_in_flight("t"), keys.webhook_host_in_flight("example.com")],
    }
    for family, names in families.items():
        assert len({slot_of(name) for name in names}) == 1, family
    assert len({slot_of(names[0]) for names in families.values()}) == len(families)  # and not all on one
    run_ids = [uuid.uuid4().hex for _ in range(200)]  # runs share 4096 tags, spread over the slots ...
    assert len({slot_of(keys.run(run_id)) for run_id in run_ids}) > 150
    assert all(slot_of(keys.active_runs(r)) == slot_of(keys.run(r)) for r in run_ids)  # ... each with an active set
    assert len(set(keys.active_sets())) == 4096 and keys.active_runs(run_ids[0]) in keys.active_sets()
