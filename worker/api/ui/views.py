"""What the run page shows of a run: its facts, and each step with its calls, their observations (a
sandboxed call's with the sandbox's flags and error kind). Text stays text: the templates escape it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...core.models import Approval, Observation, Run, Step, ToolCall


@dataclass
class CallView:
    call: ToolCall
    arguments: str  # pretty JSON, or the raw string the model sent
    observation: Observation | None
    approval: Approval | None = None  # the call needed a person's approval: what was decided


@dataclass
class StepView:
    step: Step
    calls: list[CallView] = field(default_factory=list)


def _arguments(call: ToolCall) -> str:
    if isinstance(call.arguments, str):
        return call.arguments
    return json.dumps(call.arguments, indent=2, ensure_ascii=False, sort_keys=True)


def steps_of(run: Run, steps: list[Step]) -> list[StepView]:
    approvals = {(a.step, a.call_id): a for a in run.approvals}
    out = []
    for step in steps:
        by_call = {o.call_id: o for o in step.observations}
        view = StepView(step)
        for call in step.tool_calls:
            view.calls.append(CallView(call, _arguments(call), by_call.get(call.id),
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
