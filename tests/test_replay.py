"""Replay and fork: where two traces diverge (pure), and `reactq replay` / `POST /v1/runs/{id}/replay`
against real redis-server and `reactq worker` processes."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures_cluster import Cluster
from worker.core.models import Observation, Run, RunSpec, RunStatus, Step, ToolCall
from worker.core.trace_diff import diff_traces

QUESTION = "What is 6 * 7 and what is the capital of Japan and who painted the Mona Lisa?"


def calc_step(index: int, expression: str, value: str, call_id: str = "c1", thought: str = "t") -> Step:
    return Step(index=index, thought=thought, tool_calls=[ToolCall(id=call_id, name="calculator",
                                                                  arguments={"expression": expression})],
                observations=[Observation(call_id=call_id, tool="calculator", content=value)])


def run(answer: str | None) -> Run:
    return Run(spec=RunSpec(question="q"), status=RunStatus.SUCCEEDED, answer=answer)


def test_same_decisions_worded_differently_do_not_diverge() -> None:
    a = [calc_step(0, "6 * 7", "42", "c1", "let me compute"), Step(index=1, final_answer="42")]
    b = [calc_step(0, "6 * 7", "42", "zz", "I will use the calculator"), Step(index=1, final_answer="42")]
    diff = diff_traces(run("42"), a, run("42"), b)
    assert diff.diverges_at is None and all(p.same for p in diff.steps)


@pytest.mark.parametrize(("b", "at"), [
    ([calc_step(0, "6 * 7", "42"), Step(index=1, final_answer="forty-two")], 2),
    ([calc_step(0, "6*7", "42"), Step(index=1, final_answer="42")], 1),
    ([calc_step(0, "6 * 7", "41"), Step(index=1, final_answer="42")], 1),
    ([calc_step(0, "6 * 7", "42")], 2),
    ([calc_step(0, "6 * 7", "42"), Step(index=1, error="bad format"), Step(index=2, final_answer="42")], 2),
])
def test_divergence_is_the_first_step_that_differs(b: list[Step], at: int) -> None:
    a = [calc_step(0, "6 * 7", "42"), Step(index=1, final_answer="42")]
    diff = diff_traces(run("42"), a, run(None), b)
    assert diff.diverges_at == at
    assert len(diff.steps) == max(len(a), len(b)) and diff.steps[0].a.startswith("calculator(")
    json.dumps(diff.to_json())


@pytest.mark.integration
def test_replay_reuses_steps_and_forks_with_another_mode(cluster: Cluster, api_client: httpx.Client) -> None:
    cluster.start_worker(queues="steps,sandbox")
    source = json.loads(cluster.reactq("ask", QUESTION, "--wait", "--json").stdout)
    assert source["status"] == "succeeded" and source["steps"] == 2 and source["mode"] == "tools"

    same = cluster.reactq("replay", source["run_id"], "--from-step", "2")
    assert same.returncode == 0, same.stderr
    fork = cluster.wait_for_run(same.stdout.strip())
    assert fork["status"] == "succeeded" and fork["answer"] == source["answer"]
    assert fork["forked_from"] == source["run_id"] and fork["steps"] == 2
    source_trace = json.loads(cluster.reactq("trace", source["run_id"], "--json").stdout)["trace"]
    fork_trace = json.loads(cluster.reactq("trace", fork["run_id"], "--json").stdout)["trace"]
    assert fork_trace[0] == source_trace[0]  # step 1 reused as recorded, not asked again
    assert fork["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in fork_trace)
    diff = json.loads(cluster.reactq("trace", "--diff", source["run_id"], fork["run_id"], "--json").stdout)
    assert diff["diverges_at"] is None

    created = api_client.post(f"/v1/runs/{source['run_id']}/replay", json={"from_step": 1, "mode": "text"})
    assert created.status_code == 201, created.text
    text_fork = cluster.wait_for_run(created.json()["run_id"])
    assert text_fork["status"] == "succeeded" and text_fork["mode"] == "text" and text_fork["steps"] == 4
    shown = cluster.reactq("trace", "--diff", source["run_id"], text_fork["run_id"], COLUMNS="300").stdout
    assert "diverge at step 1" in shown

    bad = cluster.reactq("replay", source["run_id"], "--from-step", "4")
    assert bad.returncode == 2 and "between 1 and 3" in bad.stderr
    assert api_client.post("/v1/runs/nope/replay", json={"from_step": 1}).status_code == 404
    assert api_client.post(f"/v1/runs/{source['run_id']}/replay", json={"from_step": 0}).status_code == 422
