"""Run and step records: the one shape stored in Redis, printed by `trace`, returned by the API
and used to rebuild the prompt."""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, AllowInfNan, BaseModel, Field, Strict


def _utf8(text: str) -> str:
    """JSON may spell a lone UTF-16 surrogate (`"\\ud800"`): no UTF-8 text, so no stored record, can hold one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text: a lone surrogate at character {exc.start}") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]  # every string a user submits
# A JSON number (strict: lax mode would read `true` as 1.0 and "1.5" as 1.5) that is finite: NaN, Infinity
# and 1e400 (which parses as Infinity) are refused
Finite = Annotated[float, Strict(), AllowInfNan(False)]
MAX_INSTRUCTIONS_CHARS = 2000  # a run's extra instructions (RunSpec.instructions)
Instructions = Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS), AfterValidator(_utf8)]


def json_integer(value: Any) -> Any:
    """For a `mode="before"` validator of an int field: JSON's integers include 2.0, which strict mode
    refuses, and not `true` or "2", which lax mode takes."""
    if isinstance(value, bool | str):
        raise ValueError("should be an integer, not a boolean or a string")
    return value


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"  # a tool call waits for a person's decision; no worker holds it
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MAX_STEPS = "max_steps"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"

    @property
    def finished(self) -> bool:
        return self not in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL)


class Mode(StrEnum):
    TOOLS = "tools"  # native function calling
    TEXT = "text"  # Thought / Action / Action Input / Observation text format


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False  # some of it was estimated by reactq (the provider did not report it)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            estimated=self.estimated or other.estimated,
        )

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ToolCall(BaseModel):
    """One tool call the model asked for. `arguments` is what the model sent (dict or raw string)."""

    id: str
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class LLMReply(BaseModel):
    """The provider's reply to one chat call, normalised; stored before it is used."""

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    duration_ms: int = 0
    attempts: int = 1
    routed_model: str | None = None  # the model reactq asked (REACTQ_MODELS name) ...
    fallback_from: str | None = None  # ... when it was a fallback for this one, after repeated failures
    lost_usage: Usage = Field(default_factory=Usage)  # attempts that failed mid-call, which the provider may bill
    # a reasoning model's thinking: the message's reasoning_content / reasoning, and <think>…</think> taken
    # out of `content` (never part of the answer nor parsed); its tokens are in `usage.completion_tokens`
    reasoning: str | None = None
    reasoning_tokens: int | None = None  # as the provider reported them (completion_tokens_details), if it did


class SandboxFacts(BaseModel):
    """What the sandbox reported of one execution besides its output (kept with the observation: the
    sandbox's own result object is scratch, deleted when the run finishes)."""

    exit_code: int | None = None
    flags: list[str] = Field(default_factory=list)  # timed_out, oom_killed, truncated
    error_kind: str | None = None  # tools_sandbox's ErrorKind: timeout, oom, output_limit, ...
    tier: str = ""
    backend: str = ""
    cpu_seconds: float | None = None
    memory_peak_bytes: int | None = None
    session_cells: int | None = None  # a python session's call: the earlier cells replayed before it


class Observation(BaseModel):
    """What one tool call returned, as the model will see it."""

    call_id: str
    tool: str
    content: str
    outcome: str = "ok"  # ok | cached | error | invalid_arguments | unknown_tool | quota
    duration_ms: int = 0
    sandbox: SandboxFacts | None = None  # a sandboxed call's (python): its flags and error kind


class Step(BaseModel):
    """One ReAct step: the model's turn and what came back."""

    index: int
    thought: str | None = None
    reasoning: str | None = None  # a reasoning model's thinking before its reply (LLMReply.reasoning), for the trace
    reasoning_tokens: int | None = None  # of `usage.completion_tokens`, when the provider reported them
    raw_output: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    observations: list[Observation] = Field(default_factory=list)
    final_answer: str | None = None
    output: dict[str, Any] | None = None  # the final answer's object, validated by the run's output schema
    error: str | None = None  # format error shown to the model as observation
    reflection: bool = False  # the model's answer to a reflection prompt: `thought` holds it
    limit: str | None = None  # the loop safeguard that stopped the run here; the next step is its best effort
    best_effort: bool = False  # the last call at a limit, tools disabled: `final_answer` is the best answer
    usage: Usage = Field(default_factory=Usage)
    lost_usage: Usage = Field(default_factory=Usage)  # the call's failed attempts (estimated): in cost_usd too
    cost_usd: float = 0.0
    llm_ms: int = 0
    tools_ms: int = 0
    model: str | None = None  # the model that answered this step
    fallback_from: str | None = None  # set when that was a fallback for the run's model
    started_at: float = 0.0
    finished_at: float = 0.0


class ApprovalDecision(StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class Approval(BaseModel):
    """A tool call that needs a person's approval, and what was decided, by whom and when."""

    step: int
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    requested_at: float
    expires_at: float
    decision: ApprovalDecision | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    reason: str | None = None


class RunSpec(BaseModel):
    """What a user submits."""

    question: Text
    tenant: Text = "default"
    tier: Text = "standard"
    max_steps: int | None = None
    mode: Mode | None = None
    model: Text | None = None
    batch_id: str | None = None
    client_id: Text | None = None  # the `id` of a batch input line
    max_tokens: int | None = None  # the run's token budget (prompt + completion, all its calls)
    max_cost_usd: Finite | None = None  # the run's cost budget
    deadline_s: Finite | None = None  # the run's wall time from its first step (default REACTQ_RUN_DEADLINE_S)
    webhook_url: Text | None = None  # called when the run finishes (worker/runtime/webhooks.py)
    instructions: Instructions | None = None  # added to the run's system prompt (worker/core/prompts.py)
    # a JSON Schema the final answer must fit (worker/core/structured.py; checked at submission)
    output_schema: dict[str, Any] | None = None
    python_session: bool | None = None  # python keeps its globals across the run's calls (None: the plan's)


class Uncounted(BaseModel):
    """What a run's recorded steps used that its tenant's counters do not hold yet: counted when the run
    ends, in the write that ends it, so that a step writes nothing to the tenant's keys (on a Redis
    Cluster those are one shard for all of a tenant's runs). `spend_*` is the part of it no budget's
    reservation has charged already (a tenant without budgets)."""

    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    spend_tokens: int = 0
    spend_usd: float = 0.0

    def __add__(self, other: Uncounted) -> Uncounted:
        return Uncounted(usage=self.usage + other.usage, cost_usd=self.cost_usd + other.cost_usd,
                         spend_tokens=self.spend_tokens + other.spend_tokens,
                         spend_usd=self.spend_usd + other.spend_usd)


class Run(BaseModel):
    """The run record: one per run in Redis."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    spec: RunSpec
    status: RunStatus = RunStatus.QUEUED
    current_step: int = 0
    max_steps: int = 8
    mode: Mode = Mode.TOOLS
    model: str = ""
    answer: str | None = None
    output: dict[str, Any] | None = None  # with an output schema: the answer's validated object
    partial: bool = False  # `answer` is a best-effort answer given at a limit (the status says which)
    error: str | None = None
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    invalid_streak: int = 0
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    deadline_s: float | None = None  # the run's wall-time budget, counted from its first step ...
    deadline_at: float | None = None  # ... so time spent waiting in a long queue does not use it up
    finished_at: float | None = None
    waiting_on: str | None = None  # why a running run is not moving, e.g. "sandbox"
    cancel_recorded: bool = False  # a worker has counted this cancellation in its metrics
    approvals: list[Approval] = Field(default_factory=list)  # every call that needed approval, decided or not
    forked_from: str | None = None  # `reactq replay`: the run whose steps before `current_step` were reused
    uncounted: Uncounted | None = None  # counted on the tenant when the run ends (None: nothing yet)
    outbox_seq: int = 0  # on a Redis Cluster: the last entry this record's writes put in its outbox (store/outbox.py)

    def result_line(self) -> dict[str, Any]:
        """The batch output line of the contract."""
        return {
            "id": self.spec.client_id,
            "run_id": self.id,
            "status": self.status.value,
            "answer": self.answer,
            "output": self.output,
            "partial": self.partial,
            "steps": self.current_step,
            "usage": self.usage.model_dump(),
            "cost_usd": round(self.cost_usd, 8),
            "model": self.model,
            "error": self.error,
        }
