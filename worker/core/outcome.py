"""What one delivery of a step task did: the value `StepRunner.run_step` returns. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    """Also the `outcome` label of reactq_steps_total for the outcomes that record or end a step."""

    FENCED = "fenced"  # the run is past this step, finished or gone: nothing done
    BUSY = "busy"  # another delivery holds the run's lease: try again shortly
    WAITING = "waiting"  # sandboxed calls are pending; their results re-deliver the step
    AWAITING_APPROVAL = "awaiting_approval"  # a call waits for a person; the decision re-delivers the step
    FINAL_ANSWER = "final_answer"
    TOOL_CALLS = "tool_calls"
    REFLECTION = "reflection"  # the model answered a reflection prompt in prose; the run goes on
    INVALID_OUTPUT = "invalid_output"  # the model's output was unusable; the error is its observation
    ENDED = "ended"  # a limit or a loop ended the run
    BEST_EFFORT = "best_effort"  # the run's last call at a limit, tools disabled, for its best answer
    LLM_FAILED = "llm_failed"  # the LLM call failed for good (a 4xx), or past the deadline; the run ended
    PROVIDER_WAIT = "provider_wait"  # the LLM call failed for now: the step goes back to the queue for later
    BUDGET_EXCEEDED = "budget_exceeded"  # the next call could overshoot a run or tenant budget: run ended


@dataclass(frozen=True)
class StepOutcome:
    outcome: Outcome
    next_step: int | None = None  # the step that follows, enqueued once the run's lease is released
    next_sent: bool = False  # ... by the commit that released it (else the runner sends it after)
    go_on: bool = False  # ... by nobody: this delivery made no model call, so it runs the next step itself
    safeguard: str | None = None  # the safeguard that ended the run, if one did
    retry_in_s: float | None = None  # PROVIDER_WAIT: deliver the step again after this many seconds


FENCED = StepOutcome(Outcome.FENCED)
BUSY = StepOutcome(Outcome.BUSY)
WAITING = StepOutcome(Outcome.WAITING)
AWAITING_APPROVAL = StepOutcome(Outcome.AWAITING_APPROVAL)
