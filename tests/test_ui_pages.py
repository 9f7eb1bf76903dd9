"""The UI's trace diff, batches, evaluation reports and operations pages over HTTP: a real `reactq api`,
real workers, Redis and the api_stub (tests/fixtures_api.py); and the operations page's figures (pure)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from worker.core.ops_view import LimiterCells, OpsRaw, ops_view
from worker.runtime.ops_snapshot import read_families


def _snapshot(member: str, at: float, counters: dict[str, float], prev: dict[str, float],
              gauges: dict[str, float] | None = None, queues: list[str] | None = None) -> dict:
    return {"member": member, "queues": queues or ["reactq.steps"], "at": at, "prev_at": at - 10,
            "counters": counters, "prev": prev, "gauges": gauges or {}}


def test_ops_view_sums_rates_and_totals_over_the_live_processes() -> None:
    a = _snapshot("h:1", 1000.0, {
        "reactq_steps_total|outcome=tool_calls": 120, "reactq_steps_total|outcome=final_answer": 30,
        "reactq_llm_tokens_total|model=m,type=prompt": 5000, "reactq_llm_tokens_total|model=m,type=completion": 1000,
        "reactq_tool_failures_total|tool=search,error_type=timeout": 4,
        "reactq_llm_throttled_total|model=m,reason=provider_429": 6,
        "reactq_llm_throttled_total|model=m,reason=pacing": 9,
        "reactq_reaper_actions_total|action=lost_message": 2,
    }, {"reactq_steps_total|outcome=tool_calls": 100, "reactq_steps_total|outcome=final_answer": 30,
        "reactq_llm_tokens_total|model=m,type=prompt": 4000, "reactq_llm_tokens_total|model=m,type=completion": 1000,
        "reactq_llm_throttled_total|model=m,reason=provider_429": 3})
    b = _snapshot("h:2", 1001.0, {
        "reactq_steps_total|outcome=tool_calls": 10, "reactq_tool_failures_total|tool=search,error_type=timeout": 1,
        "reactq_tool_failures_total|tool=python,error_type=oom": 2,
        "reactq_sandbox_executions_total|tier=free,outcome=ok": 50,
        "reactq_sandbox_executions_total|tier=free,outcome=timeout": 10,
    }, {"reactq_sandbox_executions_total|tier=free,outcome=ok": 30}, gauges={
        "reactq_sandbox_warm_containers|tier=free,state=unbound": 2,
        "reactq_sandbox_warm_containers|tier=free,state=bound": 1,
        "reactq_sandbox_calls_waiting|tier=free": 3, "reactq_sandbox_backend_up|backend=docker": 1,
    }, queues=["reactq.sandbox"])
    raw = OpsRaw(now=1005.0, redis_now_us=1_000_000.0, queues={"reactq.steps": [1, 0, 7] + [0] * 7},
                 unacked=2, workers={"reactq.steps": 1}, active_runs=9,
                 limiters=[LimiterCells("m", 1_250_000.0, None, 400)], snapshots=[a, b])
    view = ops_view(raw, {"m": (60, None)})
    assert view.queues[0].total == 8 and view.queues[0].by_priority[2] == 7 and view.queues[0].workers == 1
    assert view.steps_per_s == (20 + 10) / 10  # a: 20 in its 10 s; b: 10 since it started (prev 0)
    assert view.tokens_per_s == 100.0 and view.tokens_by_model[0].labels == ("m",)
    assert [(f.labels, f.total) for f in view.tool_failures] == [(("search", "timeout"), 5), (("python", "oom"), 2)]
    [limiter] = view.limiters
    assert limiter.rpm == 60 and limiter.rpm_booked_ms == 250 and limiter.cooldown_ms == 400
    assert limiter.provider_429 == 6 and limiter.provider_429_per_min == 60 * 3 / 10
    assert limiter.held_back == {"pacing": 9}
    [tier] = view.sandbox
    assert (tier.tier, tier.warm_unbound, tier.warm_bound, tier.waiting) == ("free", 2, 1, 3)
    assert tier.executions == 60 and tier.executions_per_s == 3.0 and tier.failures_per_s == 1.0
    assert (view.backends_up, view.backends) == (1, 1)
    assert [(f.labels, f.total) for f in view.reaper] == [(("lost_message",), 2)]
    assert [p.member for p in view.processes] == ["h:1", "h:2"] and view.processes[0].age_s == 5


def test_a_process_snapshot_keeps_the_wanted_labels_and_sums_the_rest() -> None:
    registry = CollectorRegistry()
    tokens = Counter("reactq_llm_tokens_total", "t", ["model", "type", "tenant"], registry=registry)
    tokens.labels("m", "prompt", "acme").inc(5)
    tokens.labels("m", "prompt", "other").inc(7)
    Counter("reactq_unrelated_total", "u", registry=registry).inc()
    Counter("reactq_steps_total", "s", ["outcome"], registry=registry).labels("tool_calls")  # zero: left out
    Gauge("reactq_sandbox_calls_waiting", "w", ["tier"], registry=registry).labels("free").set(4)
    counters, gauges = read_families(registry)
    assert counters == {"reactq_llm_tokens_total|model=m,type=prompt": 12}
    assert gauges == {"reactq_sandbox_calls_waiting|tier=free": 4}
