"""The step decision: what happens after the model's turn. Pure: no Redis, no Celery, no network.

Whose fault decides the outcome (see STYLE.md): the model's mistakes (bad format, unknown tool,
bad arguments, repeating itself) become observations and the run goes on; limits (max steps,
deadline, token budget, too many invalid outputs in a row, a loop that a hint did not break) end
the run with a status and a reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from ..errors import InvalidArguments
from .models import LLMReply, Mode, Observation, Run, RunStatus, Step, ToolCall
from .parser import ParsedTurn, parse_text, parse_tool_reply

TRUNCATION_MARKER = "\n…[truncated {n} chars]"


class ToolLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def sandboxed(self) -> bool: ...

    @property
    def idempotent(self) -> bool: ...

    @property
    def cached(self) -> bool: ...

    def validate(self, arguments: dict[str, Any] | str) -> BaseModel: ...


class ToolLookup(Protocol):
    def get(self, name: str) -> ToolLike | None: ...

    def names(self) -> list[str]: ...

    def refusal(self, name: str) -> str | None:
        """Why a tool that exists is not available to this run (its tenant's plan), or None."""


@dataclass(frozen=True)
class Limits:
    """The run-wide safeguards (a run's own step cap is `Run.max_steps`)."""

    max_invalid_outputs: int = 3
    repeat_hint_at: int = 3
    repeat_fail_at: int = 4
    observation_max_chars: int = 4000
    max_tokens_per_run: int = 0  # 0: no budget


@dataclass(frozen=True)
class PlannedCall:
    """A validated call to execute."""

    call: ToolCall
    tool: str
    arguments: dict[str, Any]
    sandboxed: bool
    idempotent: bool
    hint: str | None = None  # appended to the observation (the call repeats an earlier one)
    cached: bool = False  # its result may come from (and goes to) the cross-run tool cache


@dataclass(frozen=True)
class Final:
    answer: str


@dataclass(frozen=True)
class Retry:
    """The output was unusable; `error` is shown to the model as the observation."""

    error: str
    kind: str


@dataclass(frozen=True)
class Act:
    """Execute `planned`; `rejected` are calls answered without running (unknown tool, bad arguments)."""

    planned: list[PlannedCall]
    rejected: list[Observation] = field(default_factory=list)


@dataclass(frozen=True)
class Reflect:
    """The model answered a reflection prompt in prose: a thought for the trace, and the run goes on."""

    thought: str


@dataclass(frozen=True)
class End:
    status: RunStatus
    reason: str
    safeguard: str = ""  # which safeguard ended the run, for the reactq_safeguards_total metric

    def __post_init__(self) -> None:
        if not self.safeguard and self.status in LIMIT_SAFEGUARDS:
            object.__setattr__(self, "safeguard", LIMIT_SAFEGUARDS[self.status])


LIMIT_SAFEGUARDS = {
    RunStatus.MAX_STEPS: "max_steps",
    RunStatus.TIMEOUT: "deadline",
    RunStatus.BUDGET_EXCEEDED: "token_budget",
}


Decision = Final | Retry | Act | Reflect | End


def call_signature(name: str, arguments: dict[str, Any] | str) -> str:
    canonical = arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)
    return f"{name.strip().lower()}:{canonical}"


def parse_reply(mode: Mode, reply: LLMReply) -> ParsedTurn:
    """The model's turn in `reply`, read as `mode` says, with call ids made unique (the ids under which
    a step stores its calls' results: the step and the retention sweep must agree on them)."""
    turn = parse_tool_reply(reply.content, reply.tool_calls) if mode == Mode.TOOLS else parse_text(reply.content)
    turn.calls = unique_call_ids(turn.calls)
    return turn


def unique_call_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """Models sometimes repeat or omit call ids; results are stored per call id, so make them unique."""
    seen: set[str] = set()
    out = []
    for i, call in enumerate(calls):
        call_id = call.id or f"call-{i}"
        base, n = call_id, i
        while call_id in seen:  # a suffixed id may itself be taken: ["a", "a-2", "a"]
            call_id = f"{base}-{n}"
            n += 1
        seen.add(call_id)
        out.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return out


def precheck(run: Run, now: float, limits: Limits) -> End | None:
    """Limits checked before a step calls the model."""
    if run.status == RunStatus.CANCELLED:
        return End(RunStatus.CANCELLED, run.error or "cancelled")
    return _limit_reached(run, run.current_step, now, limits)


def _limit_reached(run: Run, steps_done: int, now: float, limits: Limits) -> End | None:
    """The step, deadline and token-budget checks, shared by `precheck` and `after_step`."""
    if steps_done >= run.max_steps:
        return End(RunStatus.MAX_STEPS, f"reached max_steps={run.max_steps} without a final answer")
    if run.deadline_at is not None and now >= run.deadline_at:
        return End(RunStatus.TIMEOUT, "run deadline passed")
    spent = run.usage.prompt_tokens + run.usage.completion_tokens
    if limits.max_tokens_per_run and spent >= limits.max_tokens_per_run:
        return End(RunStatus.BUDGET_EXCEEDED, f"token budget of {limits.max_tokens_per_run} spent ({spent})")
    return None


def decide(
    run: Run, history: list[Step], turn: ParsedTurn, tools: ToolLookup, limits: Limits,
    reflection: str | None = None,
) -> Decision:
    """Decide what the model's parsed turn leads to. `reflection` is the reply's text when the turn
    answered a reflection prompt: prose without a tool call is then a thought, not the final answer
    (in text mode an explicit "Final Answer:" still ends the run)."""
    if reflection is not None and reflection.strip() and not turn.calls and (
        run.mode == Mode.TOOLS or turn.final_answer is None
    ):
        return Reflect(reflection.strip())
    if turn.final_answer is not None and not turn.calls:
        return Final(turn.final_answer.strip())
    if turn.error is not None or not turn.calls:
        streak = run.invalid_streak + 1
        error = turn.error or "Invalid output: no tool call and no final answer."
        if streak >= limits.max_invalid_outputs:
            return End(RunStatus.FAILED, f"{streak} invalid model outputs in a row; last: {error}",
                       "invalid_outputs")
        return Retry(error, turn.error_kind or "empty")

    seen: dict[str, int] = {}
    for step in history:
        for earlier in step.tool_calls:
            sig = _effective_signature(earlier, tools)
            seen[sig] = seen.get(sig, 0) + 1

    planned: list[PlannedCall] = []
    rejected: list[Observation] = []
    for call in turn.calls:
        sig = _effective_signature(call, tools)
        seen[sig] = seen.get(sig, 0) + 1
        occurrence = seen[sig]
        if occurrence >= limits.repeat_fail_at:
            return End(
                RunStatus.FAILED,
                f"the model repeated the same action {call.name}({_short(call.arguments)}) "
                f"{occurrence} times; stopped as a loop",
                "loop",
            )
        tool = tools.get(call.name)
        if tool is None:
            refused = tools.refusal(call.name)
            rejected.append(
                Observation(
                    call_id=call.id,
                    tool=call.name,
                    outcome="not_allowed" if refused else "unknown_tool",
                    content=f"Error: {refused}." if refused else
                    f"Error: unknown tool {call.name!r}. Available tools: {', '.join(tools.names())}.",
                )
            )
            continue
        try:
            args = tool.validate(call.arguments)
        except InvalidArguments as exc:  # a model mistake; anything else is a bug in the tool and propagates
            rejected.append(
                Observation(call_id=call.id, tool=tool.name, outcome="invalid_arguments", content=f"Error: {exc}")
            )
            continue
        hint = None
        if occurrence >= limits.repeat_hint_at:
            hint = (
                f"Note: you have called {tool.name} with these same arguments {occurrence} times. "
                "Use the observations you already have or try something different; "
                "one more repetition ends the run."
            )
        planned.append(
            PlannedCall(call, tool.name, args.model_dump(), tool.sandboxed, tool.idempotent, hint, tool.cached)
        )
    return Act(planned, rejected)


def _effective_signature(call: ToolCall, tools: ToolLookup) -> str:
    """Repeats are judged on what the tool would receive: `"2+2"` and `{"expression": "2+2"}` are one call."""
    tool = tools.get(call.name)
    if tool is not None:
        try:
            return call_signature(tool.name, tool.validate(call.arguments).model_dump())
        except InvalidArguments:
            pass
    return call_signature(call.name, call.arguments)


def truncate(text: str, max_chars: int) -> str:
    """Cut an observation to its budget, with a visible marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


def finish_observation(content: str, hint: str | None, limits: Limits) -> str:
    text = truncate(content, limits.observation_max_chars)
    return f"{text}\n{hint}" if hint else text


# A tool call the infrastructure could not run (no sandbox backend answered in time): the run ends failed
# with this error, and the model never sees the call's observation.
UNAVAILABLE_OUTCOME = "unavailable"
SANDBOX_UNAVAILABLE = "sandbox_unavailable: no sandbox backend could run the code in time"


def after_step(run: Run, step: Step, now: float, limits: Limits) -> End | None:
    """Outcome of a run once `step` is recorded; None means: enqueue the next step.

    `run` is the record with the step already applied: its usage includes `step.usage` (the store
    adds it before asking), so the step's tokens are not counted a second time here.
    """
    if step.final_answer is not None:
        return End(RunStatus.SUCCEEDED, "")
    if any(o.outcome == UNAVAILABLE_OUTCOME for o in step.observations):
        return End(RunStatus.FAILED, SANDBOX_UNAVAILABLE)
    return _limit_reached(run, step.index + 1, now, limits)


def _short(arguments: dict[str, Any] | str, limit: int = 80) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"
