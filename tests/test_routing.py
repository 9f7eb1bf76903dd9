"""Model routing: a run names its model (API, batch line, `ask --model`); a model that keeps failing
hands the step to its fallbacks; the trace, the price and the metrics say which model answered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_cluster import Cluster
from tests.fixtures_stub import StubControl
from worker import metrics
from worker.config import ModelSpec
from worker.core.models import LLMReply, Run, RunSpec, Usage
from worker.errors import LLMError
from worker.llm.fallback import RoutedLLM
from worker.tenancy.budgets import call_max_tokens, worst_prices

MODELS = {"primary": ModelSpec(fallbacks=["backup", "last"]), "backup": ModelSpec(), "last": ModelSpec()}


class Scripted:
    """An LLMClient whose models fail as told."""

    def __init__(self, failing: dict[str, str]) -> None:
        self.failing = failing
        self.asked: list[str] = []

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> LLMReply:
        model = options["model"]
        self.asked.append(model)
        if model in self.failing:
            raise LLMError(f"{model} failed", 3, self.failing[model])
        return LLMReply(content="ok", model=f"{model}-2024", usage=Usage(prompt_tokens=3, completion_tokens=1))


def fallbacks(model: str, fallback: str) -> float:
    return metrics.LLM_FALLBACKS.labels(model, fallback)._value.get()


def test_repeated_server_errors_and_timeouts_move_the_step_down_the_chain() -> None:
    before = fallbacks("primary", "backup"), fallbacks("backup", "last")
    inner = Scripted({"primary": "server_error", "backup": "timeout"})
    reply = RoutedLLM(inner, MODELS).chat([], model="primary")
    assert inner.asked == ["primary", "backup", "last"]
    assert (reply.routed_model, reply.fallback_from) == ("last", "primary")
    assert (fallbacks("primary", "backup"), fallbacks("backup", "last")) == (before[0] + 1, before[1] + 1)


def test_a_client_error_or_the_last_model_failing_fails_the_step() -> None:
    with pytest.raises(LLMError):
        RoutedLLM(Scripted({"primary": "client_error"}), MODELS).chat([], model="primary")
    inner = Scripted({"primary": "server_error", "backup": "server_error", "last": "server_error"})
    with pytest.raises(LLMError, match="last failed"):
        RoutedLLM(inner, MODELS).chat([], model="primary")


def test_a_model_without_fallbacks_is_asked_alone() -> None:
    reply = RoutedLLM(Scripted({}), MODELS).chat([], model="reactq-stub")
    assert (reply.routed_model, reply.fallback_from, reply.model) == ("reactq-stub", None, "reactq-stub-2024")


def test_a_call_is_budgeted_at_the_dearest_model_that_may_answer_it() -> None:
    """The budget reservation (worker/tenancy/budgets.py) happens before routing picks the answering model."""
    prices = {"primary": (1.0, 2.0), "backup": (10.0, 20.0), "last": (0.5, 30.0)}
    assert worst_prices("primary", MODELS, prices) == {"primary": (10.0, 30.0)}
    assert worst_prices("backup", MODELS, prices) == {"backup": (10.0, 20.0)}
    assert worst_prices("unpriced", MODELS, prices) == {}
    run = Run(spec=RunSpec(question="q", max_cost_usd=0.01), model="primary")
    assert call_max_tokens(run, 0, 10_000, 0, prices) == 5000  # at primary's own $2/M
    assert call_max_tokens(run, 0, 10_000, 0, worst_prices("primary", MODELS, prices)) == 333  # at last's $30/M


ROUTED_MODELS = json.dumps({
    "primary": {"fallbacks": ["backup"], "prices_per_mtok": [1.0, 2.0]},
    "backup": {"prices_per_mtok": [10.0, 20.0]},
})


@pytest.mark.integration
def test_a_failing_model_falls_back_and_the_trace_records_it(cluster: Cluster, stub_control: StubControl,
                                                             tmp_path: Path) -> None:
    stub_control.set_faults(fail_models=["primary"])
    cluster.env["REACTQ_MODELS"] = ROUTED_MODELS
    cluster.start_worker(queues="steps", concurrency=4, REACTQ_LLM_MAX_RETRIES="1")

    asked = cluster.reactq("ask", "What is 17 * 23 + 4?", "--model", "primary", "--wait", "--json")
    run = json.loads(asked.stdout)
    assert run["status"] == "succeeded" and "395" in run["answer"], run
    trace = json.loads(cluster.reactq("trace", run["run_id"], "--json").stdout)["trace"]
    assert {(s["model"], s["fallback_from"]) for s in trace} == {("backup", "primary")}
    usage = run["usage"]
    expected_cost = (usage["prompt_tokens"] * 10 + usage["completion_tokens"] * 20) / 1e6  # backup's price
    assert run["cost_usd"] == pytest.approx(expected_cost, rel=1e-6)

    infile = tmp_path / "in.jsonl"
    infile.write_text(json.dumps({"id": "b", "question": "What is 2 to the power of 10?", "model": "backup"}) + "\n")
    out = tmp_path / "out.jsonl"
    result = cluster.reactq("batch", str(infile), "--out", str(out))
    assert result.returncode == 0, result.stderr
    line = json.loads(out.read_text())
    assert (line["status"], line["model"]) == ("succeeded", "backup") and "1024" in line["answer"]

    unknown = cluster.reactq("ask", "What is 2 + 2?", "--model", "gpt-9")
    assert unknown.returncode == 2 and "unknown model 'gpt-9'" in unknown.stdout + unknown.stderr
