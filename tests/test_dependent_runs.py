"""Dependent multi-hop runs end to end, in both protocols: real redis-server, a real `reactq worker`, the real
api_stub over HTTP and reactq's own search and calculator. Each call is built from the observation before it."""

from __future__ import annotations

import json

import pytest

from tests.fixtures_cluster import Cluster

pytestmark = pytest.mark.integration


def ask(cluster: Cluster, question: str, mode: str) -> tuple[dict, list[dict]]:
    done = cluster.reactq("ask", question, "--wait", "--json", REACTQ_MODE=mode)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    trace = json.loads(cluster.reactq("trace", run["run_id"], "--json", check=True).stdout)["trace"]
    return run, trace


def calls_of(trace: list[dict]) -> list[tuple[str, str, str]]:
    """(tool, its one argument, the observation) of every call, in order."""
    return [(c["name"], next(iter(c["arguments"].values())), o["content"])
            for step in trace for c, o in zip(step["tool_calls"], step["observations"], strict=True)]


@pytest.mark.parametrize("mode", ["tools", "text"])
def test_dependent_runs_of_three_steps_and_more(cluster: Cluster, mode: str) -> None:
    cluster.start_worker(queues="steps", concurrency=4, REACTQ_MODE=mode)

    run, trace = ask(cluster, "How old was the director of the 2021 Best Picture winner in 2024?", mode)
    assert run["status"] == "succeeded" and "42 years old" in run["answer"], run
    calls = calls_of(trace)
    assert [(t, a) for t, a, _ in calls] == [("search", "2021 Oscars Best Picture winner"),
                                             ("search", "Nomadland director"),
                                             ("search", "Chloé Zhao birth year"),
                                             ("calculator", "2024 - 1982")]
    assert "Nomadland" in calls[0][2] and "Chloé Zhao" in calls[1][2] and "1982" in calls[2][2]
    assert run["steps"] == 5 and all(len(step["tool_calls"]) <= 1 for step in trace)  # one hop per step

    run, trace = ask(cluster, "特斯拉CEO马斯克的妈妈是谁？她到2024年多大年纪？", mode)
    assert run["status"] == "succeeded" and "梅耶·马斯克" in run["answer"] and "76岁" in run["answer"], run
    assert [a for _, a, _ in calls_of(trace)] == ["特斯拉 CEO", "埃隆·马斯克的母亲", "梅耶·马斯克出生年份",
                                                  "2024 - 1948"]

    run, trace = ask(cluster, "What is 3 × (4 + 5)²?", mode)
    assert run["status"] == "succeeded" and run["answer"] == "243", run
    (_, first, error), (_, second, result) = calls_of(trace)
    assert first == "3 × (4 + 5)²" and error.startswith("Error: ") and (second, result) == ("3 * (4 + 5) ** 2", "243")
