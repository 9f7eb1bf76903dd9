"""The step decision: what happens after the model's turn. Pure: no Redis, no Celery, no network.

Whose fault decides the outcome (see docs/STYLE.md): the model's mistakes (bad format, unknown tool,
bad arguments, repeating itself) become observations and the run goes on; limits (max steps,
deadline, token budget, too many invalid outputs in a row, a loop that a hint did not break) end
the run with a status and a reason.

Model output as small and reasoning models write it (docs/decisions/model-output.md):
- A tool call written as text (JSON, fenced, or in call tags: parser.text_tool_calls) runs like a native
  call only if every call in it names an offered tool (a name or an alias the tenant's plan allows) with
  arguments the tool accepts (the same `validate` as native calls); otherwise the turn is a format error
  (`text_call_rejected`) naming what is wrong, and counts towards `max_invalid_outputs`. Unlike a native
  call of an unknown tool (an observation, the run goes on without counting), such text may not have been
  meant as a call at all, so it is never run half-way nor taken as the answer.
- Reasoning (`LLMReply.reasoning`, `<think>…</think>` left in the content) is split off before parsing
  (`parse_reply`) and kept on the turn for the step's trace.
- A call named like a placeholder (`<tool name>`, any `<…>` that is not an offered tool) is a format error
  (`placeholder`), never a call of an unknown tool; so is an Action Input or Final Answer that is a
  placeholder of a hint or the prompt (the parser finds those). Format hints never show placeholders: they
  show a call of the first offered tool with plausible arguments (prompts.format_example).
- A reply cut at max_tokens (finish_reason "length") is never a final answer: unless it is complete calls
  (each call's arguments a whole JSON object), the turn is a format error (`truncated`) telling the model
  its reply was cut off and to reply much shorter. It uses the same budget as every format error
  (`max_invalid_outputs` in a row); when the last one of the streak was cut off the run ends `failed` with
  the reason "the model's reply was cut off at max_tokens (...)" and safeguard `cut_off`, which, like
  `invalid_outputs`, gets a best-effort answer (best_effort.py) when those are on: the run then has
  `partial` true. There is no RunStatus "partial": `Run.partial` (a best-effort answer at a limit, the
  status says which) is the existing way to say so, and a new status would change the contract.
- A prompt the provider refuses as larger than the model's context (the LLM edge's outcome
  "context_exceeded") is sent once more without older observations' bodies; refused again, the run ends
  `failed` (safeguard `context_exceeded`) with a best-effort answer: `after_context_exceeded`. Wired so
  far: the compaction and retry (worker/llm/context_guard.py); the step still ends such a run `failed`
  with the LLM error, without the best-effort call (that is the runner's LLMError handling).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from ..errors import InvalidArguments
from .models import LLMReply, Mode, Observation, Run, RunStatus, Step, ToolCall
from .parser import (
    FormatExample,
    ParsedTurn,
    is_placeholder_name,
    join_reasoning,
    parse_text,
    parse_tool_reply,
    split_reasoning,
)
from .structured import SCHEMA_ERROR_KIND, Answered, OutputCheck, Refused, final_call, never_valid_reason, read_output

TRUNCATION_MARKER = "\n…[truncated {n} chars]"
# Format errors the engine finds (beside the parser's PARSE_ERROR_KINDS), for the parse-errors metric
ENGINE_ERROR_KINDS: tuple[str, ...] = ("text_call_rejected", "truncated", SCHEMA_ERROR_KIND)
CUT_OFF_REASON = "the model's reply was cut off at max_tokens"


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
    thought_hint_at: int = 3  # the same thought this many steps in a row gets a hint ...
    thought_fail_at: int = 4  # ... and this many ends the run
    no_progress_hint_at: int = 3  # the same observations this many steps in a row get a hint ...
    no_progress_fail_at: int = 4  # ... and this many end the run


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
    output: dict[str, Any] | None = None  # the validated object of a run with an output schema


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
    hint: str | None = None  # appended to the step's last observation (the thought repeats earlier ones)


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


def parse_reply(mode: Mode, reply: LLMReply, example: FormatExample | None = None) -> ParsedTurn:
    """The model's turn in `reply`, read as `mode` says, with call ids made unique (the ids under which
    a step stores its calls' results: the step and the retention sweep must agree on them; `example`, the
    call format errors show (prompts.format_example), changes no id)."""
    thinking, content = split_reasoning(reply.content)  # a reply stored or scripted with its <think> still in
    turn = (parse_tool_reply(content, reply.tool_calls, example) if mode == Mode.TOOLS
            else parse_text(content, example))  # fmt: skip
    if reply.finish_reason == "length" and not _complete_calls(turn):
        turn = ParsedTurn(thought=turn.thought, error=cut_off_error(mode), error_kind="truncated",
                          warnings=turn.warnings)  # fmt: skip
    turn.calls = unique_call_ids(turn.calls)
    turn.reasoning = join_reasoning(reply.reasoning, thinking)
    return turn


def _complete_calls(turn: ParsedTurn) -> bool:
    """A reply cut at max_tokens still acts if its calls were complete: every call's arguments a whole JSON
    object (a plain-text input or raw arguments may have been cut mid-way)."""
    return (turn.error is None and bool(turn.calls) and all(isinstance(c.arguments, dict) for c in turn.calls)
            and "trailing_text" not in turn.warnings)  # fmt: skip


def cut_off_error(mode: Mode) -> str:
    """What the model is told when its reply was cut off at max_tokens (finish_reason "length")."""
    shape = ("call one tool, or give the final answer in a few sentences" if mode == Mode.TOOLS else
             "one short 'Thought:' line, then either an 'Action:' and its 'Action Input:', or the 'Final Answer:'")
    return (f"{'Invalid format: ' if mode == Mode.TEXT else ''}your reply was cut off: it reached the token "
            f"limit (max_tokens) before it was complete, so it was not used. Reply again, much shorter: {shape}. "
            "If you think before replying, think briefly.")


def reply_reasoning(reply: LLMReply) -> str | None:
    """A reasoning model's thinking in `reply`: its reasoning field and any <think> left in its content."""
    return join_reasoning(reply.reasoning, split_reasoning(reply.content)[0])


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


def precheck(run: Run, now: float, limits: Limits, history: Sequence[Step] = ()) -> End | None:
    """Limits checked before a step calls the model: a cancel, a loop the previous step stopped at
    (recorded as its `limit`, the run kept going for its best-effort answer), then the run's limits."""
    if run.status == RunStatus.CANCELLED:
        return End(RunStatus.CANCELLED, run.error or "cancelled")
    last = history[-1] if history else None
    if last is not None and last.limit and not last.best_effort:
        if last.error:
            return End(RunStatus.FAILED, last.error, last.limit)
        stalled = check_progress(history[:-1], last.observations, limits).end  # no error: a tool step
        return stalled or End(RunStatus.FAILED, f"stopped by the {last.limit} safeguard", last.limit)
    return _limit_reached(run, run.current_step, now, limits)


def _limit_reached(run: Run, steps_done: int, now: float, limits: Limits) -> End | None:
    """The step, deadline and token-budget checks, shared by `precheck` and `after_step`."""
    if steps_done >= run.max_steps:
        return End(RunStatus.MAX_STEPS, f"reached max_steps={run.max_steps} without a final answer")
    if run.deadline_at is not None and now >= run.deadline_at:
        return End(RunStatus.TIMEOUT, "run deadline passed")
    spent = run.usage.total
    if limits.max_tokens_per_run and spent >= limits.max_tokens_per_run:
        return End(RunStatus.BUDGET_EXCEEDED, f"token budget of {limits.max_tokens_per_run} spent ({spent})")
    return None


def decide(
    run: Run, history: list[Step], turn: ParsedTurn, tools: ToolLookup, limits: Limits,
    reflection: str | None = None, output: OutputCheck | None = None,
) -> Decision:
    """Decide what the model's parsed turn leads to. `reflection` is the reply's text when the turn
    answered a reflection prompt: prose without a tool call is then a thought, not the final answer
    (in text mode an explicit "Final Answer:" still ends the run). `output`: the run's output schema,
    which a final answer must fit (structured.py); an answer that does not is a format error."""
    if reflection is not None and reflection.strip() and not turn.calls and (
        run.mode == Mode.TOOLS or turn.final_answer is None
    ):
        return Reflect(reflection.strip())
    if output is not None and (structured := _structured_answer(turn, output)) is not None:
        if isinstance(structured, Answered):
            return Final(structured.text, structured.output)
        return _invalid(run, structured.observation(run.mode), SCHEMA_ERROR_KIND, limits, structured.problem)
    if turn.final_answer is not None and not turn.calls:
        return Final(turn.final_answer.strip())
    error, kind = turn.error, turn.error_kind
    if error is None:
        error, kind = _placeholder_calls(turn.calls, tools)
    if error is None and "text_tool_call" in turn.warnings:
        error, kind = _text_calls_rejected(turn.calls, tools)
    if error is not None or not turn.calls:
        return _invalid(run, error or "Invalid output: no tool call and no final answer.", kind, limits)

    same_thought = repeated_thought(history, turn.thought)
    if same_thought >= limits.thought_fail_at:
        return End(RunStatus.FAILED, f"the model wrote the same thought {same_thought} times in a row; "
                   "stopped as a loop", "repeated_thought")

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
                f"{HINT_PREFIX} you have called {tool.name} with these same arguments {occurrence} times. "
                "Use the observations you already have or try something different; "
                "one more repetition ends the run."
            )
        planned.append(
            PlannedCall(call, tool.name, args.model_dump(), tool.sandboxed, tool.idempotent, hint, tool.cached)
        )
    thought_hint = None
    if same_thought >= limits.thought_hint_at:
        thought_hint = (f"{HINT_PREFIX} you have written this same thought {same_thought} times in a row. "
                        "Think again from the observations you have, or give your Final Answer; "
                        "one more repetition ends the run.")
    return Act(planned, rejected, thought_hint)


def _invalid(run: Run, error: str, kind: str | None, limits: Limits, problem: str | None = None) -> Retry | End:
    """An unusable turn: shown to the model as `error`, or, the last of `max_invalid_outputs` in a row, the
    run's end (`problem`: the validation error of an answer the output schema refused, for the reason)."""
    streak = run.invalid_streak + 1
    if streak < limits.max_invalid_outputs:
        return Retry(error, kind or "empty")
    if kind == "truncated":
        return End(RunStatus.FAILED, f"{CUT_OFF_REASON} ({streak} invalid model outputs in a row, the last "
                   "one cut off)", "cut_off")
    if problem is not None:
        return End(RunStatus.FAILED, never_valid_reason(streak, problem), "invalid_outputs")
    return End(RunStatus.FAILED, f"{streak} invalid model outputs in a row; last: {error}", "invalid_outputs")


def _structured_answer(turn: ParsedTurn, output: OutputCheck) -> Answered | Refused | None:
    """The turn's answer to a run with an output schema: a `final_answer` call (alone), or a final answer
    in text; None when the turn is neither (tool calls, a format error: decided as for any run)."""
    call = final_call(turn.calls)
    if call is not None and len(turn.calls) > 1:
        return Refused("the final_answer call came with other tool calls; call it alone, once you have their "
                       "results")
    if call is not None:
        return read_output(call.arguments, output)
    if turn.final_answer is not None and not turn.calls and turn.error is None:
        return read_output(turn.final_answer, output)
    return None


def _placeholder_calls(calls: Sequence[ToolCall], tools: ToolLookup) -> tuple[str | None, str | None]:
    """A call named like a placeholder (`<tool name>`, any `<…>` that is no offered tool): the model copied
    the format instead of filling it in; a format error, never a call of an unknown tool."""
    for call in calls:
        if is_placeholder_name(call.name) and tools.get(call.name) is None:
            return (f"Invalid format: {call.name[:64]!r} is a placeholder, not a tool name. Write the name of one "
                    f"of the tools ({', '.join(tools.names()) or 'none'}) as it is, without angle brackets."
                    ), "placeholder"  # fmt: skip
    return None, None


def _text_calls_rejected(calls: Sequence[ToolCall], tools: ToolLookup) -> tuple[str | None, str | None]:
    """A tool call the model wrote as text (JSON, call tags) runs only if each of its calls names an offered
    tool with arguments that tool accepts; otherwise the whole turn is a format error saying what is wrong
    (never the final answer, never an unknown-tool observation: the model may not have meant a call)."""
    problems = []
    for call in calls:
        tool = tools.get(call.name)
        if tool is None:
            refused = tools.refusal(call.name)
            problems.append(refused or f"{call.name[:64]!r} is not one of the tools")
            continue
        try:
            tool.validate(call.arguments)
        except InvalidArguments as exc:
            problems.append(str(exc))
    if not problems:
        return None, None
    return (f"Invalid format: your reply is a tool call written as text, and {'; '.join(problems)}. Call one "
            f"of the tools ({', '.join(tools.names()) or 'none'}) with arguments it accepts, or reply with "
            "the final answer only."), "text_call_rejected"


def _normal(text: str | None) -> str:
    return " ".join((text or "").split()).casefold()


def repeated_thought(history: Sequence[Step], thought: str | None) -> int:
    """How many steps in a row, this turn included, wrote `thought` (whitespace and case aside; a
    reflection step is skipped, a step without a thought breaks the run). 0 for no thought."""
    wanted = _normal(thought)
    if not wanted:
        return 0
    count = 1
    for step in reversed(history):
        if step.reflection:
            continue
        if _normal(step.thought) != wanted:
            break
        count += 1
    return count


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


# Every hint the engine appends to an observation starts with this; `_HINTS` finds them again, so that
# comparing observations (no progress) is not fooled by the hints of earlier steps.
HINT_PREFIX = "Note:"
_HINTS = re.compile(r"\nNote: (?:you have called |you have written this same thought |"
                    r"your last \d+ steps returned the same)")


def _seen(step_observations: Sequence[Observation]) -> tuple[str, ...]:
    return tuple(_HINTS.split(o.content, maxsplit=1)[0] for o in step_observations)


@dataclass(frozen=True)
class Progress:
    """Whether a step with tool calls moved the run on: `streak` steps in a row (this one included)
    returned the same observations; past the limits a hint, then an end."""

    streak: int
    hint: str | None = None
    end: End | None = None


def check_progress(history: Sequence[Step], observations: Sequence[Observation], limits: Limits) -> Progress:
    """Steps without observations (invalid outputs, reflections) are skipped: they are no progress either."""
    seen = _seen(observations)
    if not seen:
        return Progress(0)
    streak = 1
    for step in reversed(history):
        if not step.observations:
            continue
        if _seen(step.observations) != seen:
            break
        streak += 1
    if streak >= limits.no_progress_fail_at:
        return Progress(streak, end=End(
            RunStatus.FAILED, f"{streak} steps in a row returned the same observation; stopped as making "
            "no progress", "no_progress"))
    if streak >= limits.no_progress_hint_at:
        return Progress(streak, hint=(
            f"{HINT_PREFIX} your last {streak} steps returned the same observation. Do not try again the "
            "same way: use what you have and give your Final Answer, or try a different tool or input; "
            "one more such step ends the run."))
    return Progress(streak)


# A tool call the infrastructure could not run (no sandbox backend answered in time): the run ends failed
# with the call's observation as its error (fixed words, tools_sandbox's one text for it), and the model never
# sees that observation.
UNAVAILABLE_OUTCOME = "unavailable"


CONTEXT_EXCEEDED_REASON = "the conversation does not fit the model's context window, even compacted"


def after_context_exceeded(retried: bool) -> str | End:
    """What a step does when the provider refused its prompt as larger than the model's context (the LLM
    edge's LLMError outcome "context_exceeded"): the first time, "compact": send the conversation again
    with older observations' bodies dropped (prompts.drop_observation_bodies); when that was refused too,
    end the run (failed, safeguard `context_exceeded`), with a best-effort answer from the compacted
    conversation when those are on (best_effort.eligible)."""
    if not retried:
        return "compact"
    return End(RunStatus.FAILED, CONTEXT_EXCEEDED_REASON, "context_exceeded")


def after_step(run: Run, step: Step, now: float, limits: Limits) -> End | None:
    """Outcome of a run once `step` is recorded; None means: enqueue the next step.

    `run` is the record with the step already applied: its usage includes `step.usage` (the store
    adds it before asking), so the step's tokens are not counted a second time here.
    """
    if step.final_answer is not None:
        return End(RunStatus.SUCCEEDED, "")
    for unavailable in (o for o in step.observations if o.outcome == UNAVAILABLE_OUTCOME):
        return End(RunStatus.FAILED, unavailable.content)
    return _limit_reached(run, step.index + 1, now, limits)


def _short(arguments: dict[str, Any] | str, limit: int = 80) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"
