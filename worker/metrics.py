"""Prometheus metrics of the API and step workers (names fixed by docs/DESIGN.md; dashboards query them).

Label values are bounded: statuses, outcomes, tool names, models, configured tenants (others
count as "other"). Never a run id or free text. Sandbox metrics live in tools_sandbox.base.metrics.
"""

from __future__ import annotations

import re

from prometheus_client import Counter, Gauge, Histogram

from .core.models import RunStatus
from .core.outcome import Outcome
from .names import QUEUES

TURN_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)
LLM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)

RUNS_TOTAL = Counter("reactq_runs_total", "Runs that ended, by final status.", ["status"])
RUNS_IN_PROGRESS = Gauge("reactq_runs_in_progress", "Runs queued or running (from Redis).",
                         multiprocess_mode="max")
RUN_TURNS = Histogram("reactq_run_turns", "ReAct steps a run took.", ["status"], buckets=TURN_BUCKETS)
RUN_DURATION = Histogram("reactq_run_duration_seconds", "Run wall time from submit to end.", ["status"],
                         buckets=DURATION_BUCKETS)
STEPS_TOTAL = Counter("reactq_steps_total", "Steps executed, by outcome.", ["outcome"])
LLM_REQUESTS = Counter("reactq_llm_requests_total", "LLM HTTP attempts.", ["model", "outcome"])
LLM_DURATION = Histogram("reactq_llm_request_duration_seconds", "LLM attempt latency.", ["model"],
                         buckets=LLM_BUCKETS)
LLM_TOKENS = Counter("reactq_llm_tokens_total", "Tokens the provider reported.", ["model", "type", "tenant"])
LLM_TOKENS_LOST = Counter("reactq_llm_tokens_lost_total",
                          "Tokens of LLM attempts that failed after the request went out (timed out, cut "
                          "mid-answer), which the provider may bill: estimated by reactq.", ["model", "type"])
LLM_COST = Counter("reactq_llm_cost_usd_total", "Token spend in USD from the price table.", ["model", "tenant"])
PARSE_ERRORS = Counter("reactq_parse_errors_total", "Model outputs that could not be used.", ["kind"])
TOOL_CALLS = Counter("reactq_tool_calls_total", "Tool calls, by outcome.", ["tool", "outcome"])
TOOL_FAILURES = Counter("reactq_tool_failures_total", "Tool calls that failed.", ["tool", "error_type"])
TOOL_DURATION = Histogram("reactq_tool_duration_seconds", "Tool call latency.", ["tool"], buckets=LLM_BUCKETS)
SAFEGUARDS = Counter("reactq_safeguards_total", "Times a safeguard acted (hint, compaction, cut-off, limit).",
                     ["kind"])
LLM_THROTTLED = Counter("reactq_llm_throttled_total",
                        "Calls held back by the shared provider limits: paced (slept), held by the window "
                        "guard (window), re-queued (rpm, tpm, cooldown), refused by the provider "
                        "(provider_429), not sent while its circuit was open (circuit_open), or with every slot of its "
                        "server taken (in_flight).", ["model", "reason"])
LLM_LIMITER_WAIT = Histogram("reactq_llm_limiter_wait_seconds", "Time a call waited for its reserved slot.",
                             ["model"], buckets=(0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5))
LLM_CIRCUIT_OPEN = Gauge("reactq_llm_circuit_open", "1 while the model's provider circuit is open (its calls failing: "
                         "nobody calls it until it closes), as this process last saw it.", ["model"],
                         multiprocess_mode="max")
LLM_FALLBACKS = Counter("reactq_llm_fallbacks_total",
                        "Steps that moved to a fallback model after repeated 5xx or timeouts.", ["model", "fallback"])
REAPER_ACTIONS = Counter("reactq_reaper_actions_total", "Stranded runs the reaper re-enqueued, by why; "
                         "and finished runs it dropped from the active set.", ["action"])
APPROVALS = Counter("reactq_approvals_total", "Tool calls decided by a person (or expired), by outcome.",
                    ["outcome"])
TOOL_STUCK_THREADS = Gauge("reactq_tool_stuck_threads", "Threads of inline tool calls past their deadline that "
                           "still run (abandoned; see REACTQ_TOOL_STUCK_THREADS_MAX).", multiprocess_mode="livesum")
QUEUE_DEPTH = Gauge("reactq_queue_depth", "Messages waiting in a queue.", ["queue"], multiprocess_mode="max")

SAFEGUARD_KINDS = ("repeat_hint", "loop", "invalid_outputs", "observation_truncated", "context_compacted",
                   "max_steps", "deadline", "token_budget",
                   "thought_hint", "repeated_thought", "no_progress_hint", "no_progress", "best_effort_answer",
                   "cut_off", "context_exceeded")
# Recorded steps by what they did, and "ended" for a run stopped between steps (limit, LLM failure).
STEP_OUTCOMES = (Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER, Outcome.REFLECTION, Outcome.INVALID_OUTPUT,
                 Outcome.ENDED, Outcome.BEST_EFFORT)
LLM_OUTCOMES = ("ok", "rate_limited", "server_error", "client_error", "timeout", "connection_error",
                "context_exceeded")


_ERROR_TYPE = re.compile(r"[a-z][a-z0-9_]{0,39}")


def tenant_label(tenant: str, configured: list[str]) -> str:
    return tenant if tenant in configured else "other"


def error_type_label(error_type: str) -> str:
    """A tool failure's error type as a label: a short identifier, else "other" (never free text)."""
    return error_type if _ERROR_TYPE.fullmatch(error_type) else "other"


def initialise(model: str, tenants: list[str], tools: list[str], parse_kinds: tuple[str, ...]) -> None:
    """Create the label sets dashboards divide by, so their rates exist from the first scrape."""
    for status in RunStatus:
        if status.finished:
            RUNS_TOTAL.labels(status.value)
    for step_outcome in STEP_OUTCOMES:
        STEPS_TOTAL.labels(step_outcome.value)
    for outcome in LLM_OUTCOMES:
        LLM_REQUESTS.labels(model, outcome)
    LLM_DURATION.labels(model)
    for kind in ("prompt", "completion"):
        LLM_TOKENS_LOST.labels(model, kind)
    LLM_CIRCUIT_OPEN.labels(model).set(0)
    for tenant in [*tenants, "other"]:
        LLM_COST.labels(model, tenant)
        for kind in ("prompt", "completion"):
            LLM_TOKENS.labels(model, kind, tenant)
    for kind in parse_kinds:
        PARSE_ERRORS.labels(kind)
    for tool in tools:
        TOOL_CALLS.labels(tool, "ok")
        TOOL_CALLS.labels(tool, "error")
        TOOL_DURATION.labels(tool)
    for kind in SAFEGUARD_KINDS:
        SAFEGUARDS.labels(kind)
    for outcome in ("approved", "rejected", "expired"):
        APPROVALS.labels(outcome)
    for queue in QUEUES:
        QUEUE_DEPTH.labels(queue)
    for action in ("dead_worker", "lost_message", "long_stale", "sandbox_lost", "sandbox_deadline", "dropped",
                   "sandbox_unavailable"):
        REAPER_ACTIONS.labels(action)
