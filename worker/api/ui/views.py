"""What the run page shows of a run: its facts, and each step with its calls, their observations and
the sandbox result's flags (validated: another process wrote it). Text stays text: the templates escape it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tools_sandbox import SandboxResult

from ...core.models import Approval, Observation, Run, Step, ToolCall
from ...store.runs import RunStore


@dataclass
class CallView:
    call: ToolCall
    arguments: str  # pretty JSON, or the raw string the model sent
    observation: Observation | None
    sandbox: dict[str, Any] | None = None  # flags, error_kind, exit code ... of a sandbox result
    approval: Approval | None = None  # the call needed a person's approval: what was decided


@dataclass
class StepView:
    step: Step
    calls: list[CallView] = field(default_factory=list)


def _arguments(call: ToolCall) -> str:
    if isinstance(call.arguments, str):
        return call.arguments
    return json.dumps(call.arguments, indent=2, ensure_ascii=False, sort_keys=True)


def _sandbox(store: RunStore, run_id: str, index: int, call_id: str) -> dict[str, Any] | None:
    raw = store.get_sandbox_result(run_id, index, call_id)
    if raw is None:
        return None
    try:
        result = SandboxResult.model_validate_json(raw)
    except ValidationError:
        return {"unreadable": True}
    flags = [name for name in ("timed_out", "oom_killed", "truncated") if getattr(result, name)]
    return {"flags": flags, "error_kind": result.error_kind.value if result.error_kind else None,
            "exit_code": result.exit_code, "tier": result.tier, "backend": result.backend,
            "duration_ms": result.duration_ms, "cpu_seconds": result.cpu_seconds,
            "memory_peak_bytes": result.memory_peak_bytes}


def steps_of(store: RunStore, run: Run, steps: list[Step]) -> list[StepView]:
    approvals = {(a.step, a.call_id): a for a in run.approvals}
    out = []
    for step in steps:
        by_call = {o.call_id: o for o in step.observations}
        view = StepView(step)
        for call in step.tool_calls:
            view.calls.append(CallView(call, _arguments(call), by_call.get(call.id),
                                       _sandbox(store, run.id, step.index, call.id),
                                       approvals.get((step.index, call.id))))
        out.append(view)
    return out


def timings(run: Run, steps: list[Step]) -> dict[str, str]:
    """Wall time, time in the model and in tools, as text."""
    out = {}
    end = run.finished_at if run.finished_at is not None else run.updated_at
    out["wall"] = f"{end - run.created_at:.1f} s"
    out["model"] = f"{sum(s.llm_ms for s in steps) / 1000:.1f} s"
    out["tools"] = f"{sum(s.tools_ms for s in steps) / 1000:.1f} s"
    return out
