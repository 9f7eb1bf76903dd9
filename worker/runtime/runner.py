"""One ReAct step of one run, end to end: the thin I/O shell around the pure engine.

A step task for step n may run more than once (redelivery, the reaper, a sandbox continuation).
Each run makes progress from what is stored: the LLM reply of step n, each tool result, each
sandbox dispatch. The step is recorded exactly once, by a transaction fenced on the step number.
A sandboxed call is sent with the run's deadline, when it was sent (its place in its tenant's line for
a sandbox slot) and the step's pending marker, which its sandbox task keeps alive while it waits or runs
(tools_sandbox/edges/sandbox_worker.py; the reaper reads the marker).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..core import best_effort, engine, prompts, provider_trouble, sessions
from ..core.engine import Act, End, Final, PlannedCall, Reflect, Retry
from ..core.models import LLMReply, Mode, Observation, Run, RunStatus, Step, ToolCall, Uncounted, Usage
from ..core.outcome import AWAITING_APPROVAL, BUSY, FENCED, WAITING, Outcome, StepOutcome
from ..core.parser import TEXT_STOP_SEQUENCES
from ..core.pricing import cost_usd
from ..core.sessions import CODE_ARGUMENT
from ..core.structured import SCHEMA_ERROR_KIND, Answered, call_text, final_tool, read_output
from ..errors import BudgetExceeded, LLMError
from ..output_schema import output_check
from ..store.cas import Command, Snapshot
from ..store.run_keys import working_keys
from ..store.spend import Spend
from ..store.tool_cache import cache_commands
from ..tenancy import ledger
from ..tenancy.budgets import NOTHING_DUE, reserve_call
from . import approvals
from .approvals import Waiting
from .context import Runtime
from .finish_hooks import SendWebhook, after_finish
from .prompt_inputs import turn_messages
from .sandbox_bridge import observation_from_sandbox, sandbox_request
from .tool_exec import Called, shared_executor

log = logging.getLogger("reactq.step")


@dataclass(frozen=True)
class Delivery:
    """One delivery of step `index` that holds the run's lease (taken with `token`), and what it read
    with it: the recorded steps, and the reply and tool results stored for this step by earlier ones."""

    index: int
    token: str
    steps: list[Step]
    stored_reply: LLMReply | None
    stored_results: dict[str, Observation]
    may_go_on: bool = False  # run_step's go_on


@dataclass(frozen=True)
class Dispatcher:
    """How the runner enqueues work: Celery in production (worker.tasks.steps), a recording fake in the
    in-process test harness (tests/harness.py)."""

    next_step: Callable[[str, int], None]
    sandbox: Callable[[dict[str, Any]], None]
    webhook: SendWebhook  # queue a delivery attempt: (delivery id, attempt, delay in seconds)
    # The Redis commands that enqueue a step, for a commit to write with the step it records (None:
    # the step is sent after the commit, with next_step).
    step_commands: Callable[[str, int], list[Command]] | None = None


class StepRunner:
    def __init__(self, rt: Runtime, dispatch: Dispatcher) -> None:
        self.rt = rt
        self.store = rt.store
        self.dispatch = dispatch

    def run_step(self, run_id: str, index: int, *, go_on: bool = False) -> StepOutcome:
        """Make progress on step `index` of a run, and say what happened.

        `go_on`: when this delivery records the step without asking the model (its reply was stored by an
        earlier delivery: a sandbox continuation, a person's decision) and the run goes on, the next step is
        not enqueued; the outcome says `go_on`, and the caller runs that step itself (worker/tasks/steps.py,
        docs/decisions/fair-queues.md): one Celery delivery fewer, and still one model call at most a
        delivery."""
        leases = self.rt.leases
        token = leases.new_token()
        loaded = leases.store.lease_and_load(run_id, index, token, leases.ttl_ms)
        run = loaded.run
        if run is not None and run.status == RunStatus.CANCELLED and not run.cancel_recorded:
            self._record_cancel(run_id)
        live = run is not None and not run.status.finished and run.current_step == index
        if not loaded.acquired:
            # another delivery (or the step before, finishing) holds the run's lease
            return BUSY if live else FENCED
        leases.hold(run_id, token)
        try:
            if live and loaded.snapshot is not None:
                delivery = Delivery(index, token, loaded.steps, loaded.reply, loaded.results, may_go_on=go_on)
                result = self._run_step(loaded.snapshot, delivery)
            else:
                result = FENCED
        finally:
            leases.release(run_id, token)  # unless the step's commit already let it go
        # Enqueue the next step only once the lease is gone: sent earlier, it could start (on another
        # thread or worker) while this step still held the lease, be fenced, and strand the run. With
        # Celery on Redis the commit that lets go of the lease sends it (no window between the two).
        if result.next_step is not None and not result.next_sent and not result.go_on:
            self.dispatch.next_step(run_id, result.next_step)
        return result

    def _run_step(self, snap: Snapshot, d: Delivery) -> StepOutcome:
        run, limits = snap.run, self.rt.limits
        started = time.time()
        if (end := engine.precheck(run, started, limits, d.steps)) is not None:
            if self.rt.settings.best_effort_answer and best_effort.eligible(end):
                return self._best_effort(snap, d, end, started)
            return self._end(run, end, d.index, Outcome.ENDED)
        # A queued run becomes running with its first recorded step, in that step's one write (its
        # deadline counted from when the step began): no write of its own before the model call.

        reflecting = prompts.reflection_due(d.steps, self.rt.settings.reflect_every)
        spend = NOTHING_DUE  # the call's cost, for a tenant without budgets: charged when the run ends
        try:
            if d.stored_reply is not None:
                reply = d.stored_reply
            else:
                reply, spend = self._ask(run, d.steps, d.index, started=started)
        except LLMError as exc:
            return self._after_failed_call(snap, d, exc, started)
        except BudgetExceeded as exc:
            return self._end(run, End(RunStatus.BUDGET_EXCEEDED, str(exc)), d.index, Outcome.BUDGET_EXCEEDED)

        offered = self.rt.tools_for(run.spec.tenant)
        turn = engine.parse_reply(run.mode, reply, prompts.format_example(offered.all()))
        for warning in turn.warnings:
            log.debug("parser warning %s", warning, extra={"run_id": run.id, "step": d.index})
        decision = engine.decide(run, d.steps, turn, offered, limits,
                                 reflection=(reply.content or "") if reflecting else None,
                                 output=output_check(run.spec.output_schema))
        model = reply.routed_model or run.model
        step = Step(
            index=d.index, thought=turn.thought, raw_output=reply.content, usage=reply.usage,
            lost_usage=reply.lost_usage, reasoning=turn.reasoning, reasoning_tokens=reply.reasoning_tokens,
            cost_usd=cost_usd(model, reply.usage + reply.lost_usage, self.rt.settings.prices_per_mtok),
            llm_ms=reply.duration_ms, model=model, fallback_from=reply.fallback_from, started_at=started,
        )

        if isinstance(decision, Final):
            step.final_answer, step.output = decision.answer, decision.output
            return self._commit(snap, d, step, Outcome.FINAL_ANSWER, spend=spend)
        if isinstance(decision, Reflect):
            step.thought, step.reflection = decision.thought, True
            return self._commit(snap, d, step, Outcome.REFLECTION, spend=spend)
        if isinstance(decision, Retry):
            metrics.PARSE_ERRORS.labels(decision.kind).inc()
            step.error = decision.error
            if decision.kind == SCHEMA_ERROR_KIND and not step.raw_output:
                step.raw_output = call_text(turn.calls)
            return self._commit(snap, d, step, Outcome.INVALID_OUTPUT, invalid=True, spend=spend)
        if isinstance(decision, End):
            metrics.PARSE_ERRORS.labels(turn.error_kind or "loop").inc()
            step.error = decision.reason
            step.tool_calls = turn.calls
            return self._commit(snap, d, step, Outcome.ENDED, end=self._stop_at(step, decision), spend=spend)

        step.tool_calls = turn.calls
        return self._act(snap, d, step, decision, reply, spend)

    def _act(self, snap: Snapshot, d: Delivery, step: Step, act: Act, reply: LLMReply,
             spend: Spend) -> StepOutcome:
        """Run the step's tool calls (or send its sandboxed ones) and record the step once all answered.

        When acting has effects outside the run record (a tool with effects, a sandbox run, a person
        asked), the reply is stored first, so that a redelivery acts on the same calls. Calls to
        idempotent inline tools only are like a final answer: a redelivery may ask the model again,
        and the reply is recorded with the step by the commit."""
        run, ttl = snap.run, self.rt.settings.tool_cache_ttl_s
        cacheable = [p for p in act.planned if p.cached and not p.sandboxed and ttl > 0
                     and p.call.id not in d.stored_results]
        store_reply = d.stored_reply is None and self._acts_outside(run, act)
        from_cache: dict[str, str | None] = {}
        if store_reply or cacheable:
            ours, cached = self.store.scratch.prepare_act(run.id, d.index, reply if store_reply else None,
                                                          [(p.tool, p.arguments) for p in cacheable],
                                                          also=ledger.charge_now(run.spec.tenant, spend),
                                                          tenant=run.spec.tenant)
            if not ours:
                return FENCED  # another delivery, whose lease outlived ours, stored its reply first
            from_cache, spend = {p.call.id: c for p, c in zip(cacheable, cached, strict=True)}, NOTHING_DUE
        # A reply this delivery stored, with no call waiting on a person: its sandboxed calls are claimed with the
        # wait (below), not one by one.
        own_reply = store_reply and not any(approvals.needs_approval(self.rt, run.spec.tenant, p.tool)
                                            for p in act.planned)
        sent: list[str] | None = [] if own_reply else None
        executed = self._execute(run, d, act, step.tool_calls, from_cache, sent=sent)
        if executed is Waiting.APPROVAL:
            return AWAITING_APPROVAL  # a person's decision re-enqueues this step
        if executed is Waiting.SANDBOX:
            claims = self.store.claims.dispatch_commands(run.id, d.index, sent or [],
                                                         self.rt.settings.sandbox_redispatch_after_s)
            if self.store.mark_running(snap, d.index, waiting_on="sandbox", release_lease=d.token,
                                       also=claims) is not None:
                self.rt.leases.forget(run.id, d.token)  # let go in the same write
            return WAITING
        step.observations, fresh = executed
        step.tools_ms = sum(o.duration_ms for o in step.observations)
        end = self._no_progress(d, step, hinted=act.hint is not None or any(p.hint for p in act.planned))
        return self._commit(snap, d, step, Outcome.TOOL_CALLS, end=end,
                            also=cache_commands(run.spec.tenant, fresh, ttl), spend=spend)

    def _no_progress(self, d: Delivery, step: Step, hinted: bool) -> End | None:
        """The step returned what the steps before it did: hint the model (unless another hint already
        says so: a repeated call), or stop the run."""
        progress = engine.check_progress(d.steps, step.observations, self.rt.limits)
        if progress.end is not None:
            return self._stop_at(step, progress.end)
        if progress.hint is not None and not hinted:
            metrics.SAFEGUARDS.labels("no_progress_hint").inc()
            last = step.observations[-1]
            step.observations[-1] = last.model_copy(update={"content": f"{last.content}\n{progress.hint}"})
        return None

    # --- the best-effort answer at a limit ------------------------------------------------------
    def _stop_at(self, step: Step, end: End) -> End | None:
        """How a loop `end` found at `step` ends the run: at once, or (best-effort answers on) with the
        step marked, so that the next step asks for the answer (engine.precheck turns the mark back
        into `end`)."""
        if self.rt.settings.best_effort_answer and best_effort.eligible(end):
            step.limit = end.safeguard
            return None
        return end

    def _best_effort(self, snap: Snapshot, d: Delivery, end: End, started: float) -> StepOutcome:
        """The run stops at `end`: one last call, tools disabled, for the best answer from what was
        gathered, recorded as a step (fenced on its index like any: a redelivery after the commit does
        not ask again). No room left (deadline, budget) or a failed call: the run ends without one."""
        run = snap.run
        if not best_effort.has_room(run, started, self.rt.limits):
            return self._end(run, end, d.index, Outcome.ENDED)
        spend = NOTHING_DUE
        try:
            if d.stored_reply is not None:
                reply = d.stored_reply
            else:
                reply, spend = self._ask(run, d.steps, d.index, final=end)
        except (LLMError, BudgetExceeded) as exc:
            log.info("no best-effort answer: %s", exc, extra={"run_id": run.id, "step": d.index})
            return self._end(run, end, d.index, Outcome.ENDED)
        model = reply.routed_model or run.model
        price = cost_usd(model, reply.usage + reply.lost_usage, self.rt.settings.prices_per_mtok)
        step = Step(
            index=d.index, raw_output=reply.content, final_answer=best_effort.answer_from(run.mode, reply),
            best_effort=True, usage=reply.usage, lost_usage=reply.lost_usage, cost_usd=price,
            reasoning=engine.reply_reasoning(reply), reasoning_tokens=reply.reasoning_tokens,
            llm_ms=reply.duration_ms, model=model, fallback_from=reply.fallback_from, started_at=started,
        )
        check = output_check(run.spec.output_schema)
        if step.final_answer is not None and check is not None:  # kept as the output only if it fits
            answered = read_output(step.final_answer, check)
            step.output = answered.output if isinstance(answered, Answered) else None
        if step.final_answer is not None:
            metrics.SAFEGUARDS.labels("best_effort_answer").inc()
        return self._commit(snap, d, step, Outcome.BEST_EFFORT, end=end, spend=spend)

    def _after_failed_call(self, snap: Snapshot, d: Delivery, exc: LLMError, started: float) -> StepOutcome:
        """A provider in trouble is waited out (the step goes back to the queue, the run shows it waits on the
        provider) until the run's deadline; a refusal no retry changes ends the run failed, with its reason."""
        run, s = snap.run, self.rt.settings
        if exc.outcome == provider_trouble.CONTEXT_EXCEEDED:  # refused again, compacted: ends with its best answer
            end = engine.after_context_exceeded(retried=True)
            assert isinstance(end, End)
            if s.best_effort_answer and best_effort.eligible(end):
                return self._best_effort(snap, d, end, started)
            return self._end(run, end, d.index, Outcome.LLM_FAILED)
        wait_s = exc.retry_after_s if exc.retry_after_s is not None else s.llm_circuit_base_s
        move = provider_trouble.after_failed_call(run, started, time.time(), exc.outcome, str(exc), wait_s)
        if isinstance(move, End):
            return self._end(run, move, d.index, Outcome.LLM_FAILED)
        if run.waiting_on != "provider":  # a first step starts the run's deadline clock at its own start
            self.store.mark_running(snap, d.index, waiting_on="provider", started_at=started)
        log.info("model provider unavailable; step re-queued", extra={"run_id": run.id, "step": d.index,
                                                                      "outcome": exc.outcome, "wait_s": move.wait_s})
        return StepOutcome(Outcome.PROVIDER_WAIT, retry_in_s=move.wait_s)

    def _acts_outside(self, run: Run, act: Act) -> bool:
        """Whether any call has effects beyond the run record: a sandbox run, a tool with effects, or a
        person asked to approve it."""
        return any(p.sandboxed or not p.idempotent or approvals.needs_approval(self.rt, run.spec.tenant, p.tool)
                   for p in act.planned)

    # --- the LLM reply ----------------------------------------------------------------------
    def _ask(self, run: Run, steps: list[Step], index: int, final: End | None = None,
             started: float | None = None) -> tuple[LLMReply, Spend]:
        """Ask the model for step `index`'s turn (`final`: the best-effort answer at that limit, tools
        disabled); the reply and the spend still to be charged for it (a tenant without budgets: its
        reservation charged nothing)."""
        s = self.rt.settings
        tools = self.rt.tools_for(run.spec.tenant).all()
        messages, compacted = turn_messages(self.rt, run, steps, tools)
        options: dict[str, Any] = {"model": run.model, "temperature": s.llm_temperature}
        if run.mode == Mode.TOOLS:
            options["tools"] = [t.openai_schema() for t in tools]
            if run.spec.output_schema is not None:  # the answer is a call of it (core/structured.py)
                options["tools"].append(final_tool(run.spec.output_schema))
        else:
            options["stop"] = TEXT_STOP_SEQUENCES[:4]
        if final is not None:
            messages, options = best_effort.final_request(run.mode, messages, options, final,
                                                          structured=run.spec.output_schema is not None)
        tenant = metrics.tenant_label(run.spec.tenant, s.tenants)
        with reserve_call(s, self.rt.tenants, self.rt.budgets, run, messages, options) as budget:
            try:
                reply = self.rt.llm.chat(messages, **options, max_tokens=budget.max_tokens,
                                         deadline_at=provider_trouble.deadline_of(run, started or time.time()))
            except LLMError as exc:  # its failed attempts may still be billed: charged now, the step has none
                if exc.lost_usage is not None and exc.lost_usage.total:
                    lost, cost = exc.lost_usage, cost_usd(run.model, exc.lost_usage, s.prices_per_mtok)
                    self._count_lost(run.model, tenant, lost)
                    due = budget.settle(lost, cost)
                    self.rt.budgets.store.run(ledger.charge_now(run.spec.tenant, due)
                                              + ledger.usage_commands(run, lost, cost))
                raise
            model = reply.routed_model or run.model  # a fallback's tokens are priced at its own price
            charged = reply.usage + reply.lost_usage
            spend = budget.settle(charged, cost_usd(model, charged, s.prices_per_mtok))
        metrics.LLM_TOKENS.labels(model, "prompt", tenant).inc(reply.usage.prompt_tokens)
        metrics.LLM_TOKENS.labels(model, "completion", tenant).inc(reply.usage.completion_tokens)
        metrics.LLM_COST.labels(model, tenant).inc(cost_usd(model, reply.usage, s.prices_per_mtok))
        if reply.lost_usage.total:
            self._count_lost(model, tenant, reply.lost_usage)
        if compacted:
            metrics.SAFEGUARDS.labels("context_compacted").inc()
            log.info("context compacted", extra={"run_id": run.id, "step": index, "compacted_steps": compacted})
        return reply, spend

    def _count_lost(self, model: str, tenant: str, lost: Usage) -> None:
        metrics.LLM_TOKENS_LOST.labels(model, "prompt").inc(lost.prompt_tokens)
        metrics.LLM_TOKENS_LOST.labels(model, "completion").inc(lost.completion_tokens)
        metrics.LLM_COST.labels(model, tenant).inc(cost_usd(model, lost, self.rt.settings.prices_per_mtok))

    # --- tools --------------------------------------------------------------------------------
    def _execute(
        self, run: Run, d: Delivery, act: Act, calls: list[ToolCall], cached: dict[str, str | None], *,
        sent: list[str] | None = None,
    ) -> tuple[list[Observation], list[tuple[str, dict[str, Any], str]]] | Waiting:
        """Observations in the order the model asked, and the fresh results of idempotent tools (for
        the cache); or what the step waits for (sandboxed calls, a person's approval). Results of tools
        with effects are stored before anything else happens; an idempotent tool's result is recorded
        with the step. A sandboxed call's result (the sandbox worker's stored object, as the model sees it)
        is stored as the step's only when the step goes on waiting: recorded with the step otherwise.
        `sent` (not None when this delivery stored the reply it acts on and no call needs a person's
        approval): no delivery before it can have sent these calls, so there is no result to look for and
        no claim to take before sending one; the ids of the calls sent are added to it, for the write that
        marks the run waiting to claim them (the lease keeps any other delivery of the step out until then)."""
        by_id: dict[str, Observation] = {o.call_id: o for o in act.rejected}
        for rejected in act.rejected:
            metrics.TOOL_CALLS.labels(_tool_label(rejected.tool, self.rt), rejected.outcome).inc()
        pending = False
        rendered: list[Observation] = []  # sandboxed calls' results read now, not stored as the step's yet
        fresh: list[tuple[str, dict[str, Any], str]] = []
        awaiting: list[PlannedCall] = []
        ahead: list[str] = []  # code of this step's sandboxed calls so far: a session's cells before the next
        for planned in act.planned:
            obs = d.stored_results.get(planned.call.id)
            if obs is None and (gated := approvals.gate(self.rt, run, d.index, planned)) is not None:
                if gated is Waiting.APPROVAL:
                    awaiting.append(planned)
                    continue
                obs = self.store.scratch.save_tool_result(run.id, d.index, gated)
            if obs is None and planned.sandboxed:
                obs = self._sandbox_result(run, d, planned, ahead, sent)
                pending = pending or obs is None
                if obs is not None:
                    rendered.append(obs)
            elif obs is None:
                obs = self._run_inline(planned, cached.get(planned.call.id), run.spec.tenant)
                if not planned.idempotent:
                    obs = self.store.scratch.save_tool_result(run.id, d.index, obs)
                elif planned.cached and obs.outcome == "ok":
                    fresh.append((planned.tool, planned.arguments, obs.content))
            if obs is not None:
                by_id[planned.call.id] = obs
            if planned.sandboxed:
                ahead.append(planned.arguments.get(CODE_ARGUMENT, ""))
        if awaiting or pending:  # a later delivery takes these up as they are (their metrics counted once)
            for obs in rendered:
                self.store.scratch.save_tool_result(run.id, d.index, obs)
        if awaiting:
            approvals.request(self.rt, run, d.index, awaiting)
            return Waiting.APPROVAL
        if pending:
            return Waiting.SANDBOX
        hints = {p.call.id: p.hint for p in act.planned}
        limits = self.rt.limits
        ordered = []
        for call_id in [c.id for c in calls]:
            obs = by_id[call_id]
            if len(obs.content) > limits.observation_max_chars:
                metrics.SAFEGUARDS.labels("observation_truncated").inc()
            if hints.get(call_id):
                metrics.SAFEGUARDS.labels("repeat_hint").inc()
            content = engine.finish_observation(obs.content, hints.get(call_id), limits)
            ordered.append(obs.model_copy(update={"content": content}))
        if act.hint and ordered:
            metrics.SAFEGUARDS.labels("thought_hint").inc()
            ordered[-1] = ordered[-1].model_copy(update={"content": f"{ordered[-1].content}\n{act.hint}"})
        return ordered, fresh

    def _run_inline(self, planned: PlannedCall, cached: str | None, tenant: str) -> Observation:
        """Run one inline tool call within its deadline (tool_exec), or take its result from the tenant's
        idempotent-tool cache."""
        tool = self.rt.tools.get(planned.tool)
        assert tool is not None
        t0 = time.monotonic()
        if cached is not None:
            called = Called(cached, "cached")
        else:
            called = shared_executor(self.rt.settings).call(
                tool, tool.args_model.model_validate(planned.arguments), tenant)
            if called.error_type is not None:
                metrics.TOOL_FAILURES.labels(tool.name, metrics.error_type_label(called.error_type)).inc()
        seconds = time.monotonic() - t0
        metrics.TOOL_CALLS.labels(tool.name, called.outcome).inc()
        metrics.TOOL_DURATION.labels(tool.name).observe(seconds)
        return Observation(call_id=planned.call.id, tool=tool.name, content=called.content,
                           outcome=called.outcome, duration_ms=int(seconds * 1000))

    def _sandbox_result(self, run: Run, d: Delivery, planned: PlannedCall, ahead: list[str],
                        sent: list[str] | None) -> Observation | None:
        """The stored result of a sandboxed call, or None after sending the call (at most once per
        REACTQ_SANDBOX_REDISPATCH_AFTER_S; `sent`: see _execute). In a python session the call carries the
        run's earlier cells."""
        index = d.index
        cells = sessions.earlier_cells(d.steps, ahead) if run.spec.python_session else None
        raw = self.store.scratch.get_sandbox_result(run.id, index, planned.call.id) if sent is None else None
        if raw is not None:
            obs, error_type = observation_from_sandbox(planned.call.id, planned.tool, raw,
                                                       session_cells=None if cells is None else len(cells))
            metrics.TOOL_CALLS.labels(planned.tool, obs.outcome).inc()
            if error_type is not None:
                metrics.TOOL_FAILURES.labels(planned.tool, metrics.error_type_label(error_type)).inc()
            metrics.TOOL_DURATION.labels(planned.tool).observe(obs.duration_ms / 1000)
            return obs
        ttl = self.rt.settings.sandbox_redispatch_after_s
        if sent is not None or self.store.claims.claim_dispatch(run.id, index, planned.call.id, ttl):
            now = time.time()
            deadline_at = run.deadline_at
            if deadline_at is None and run.deadline_s is not None:  # a first step: its clock starts now
                deadline_at = now + run.deadline_s
            self.dispatch.sandbox(sandbox_request(
                planned.arguments.get(CODE_ARGUMENT, ""), run_id=run.id, index=index, call_id=planned.call.id,
                tier=run.spec.tier, tenant=run.spec.tenant, deadline_at=deadline_at, queued_at=now,
                session=cells))
            if sent is not None:
                sent.append(planned.call.id)
        return None

    # --- recording ----------------------------------------------------------------------------
    def _commit(self, snap: Snapshot, d: Delivery, step: Step, outcome: Outcome, *, invalid: bool = False,
                end: End | None = None, also: list[Command] | None = None,
                spend: Spend = NOTHING_DUE) -> StepOutcome:
        """Record the step (fenced on its index) and let go of the lease in the same transaction, with
        what the step used, counted on the tenant when the run ends (its call's spend too, when no
        reservation charged it)."""
        run = snap.run
        step.finished_at = time.time()
        limits = self.rt.limits

        best = self.rt.settings.best_effort_answer

        def conclude(r: Run) -> End | None:
            """The run's end once `r` (the stored record, the step's usage added) records the step. At
            max_steps with best-effort answers on, the run goes on to a step that asks for the answer."""
            found = end or engine.after_step(r, step, step.finished_at, limits)
            if found is not None and found is not end and best and found.status == RunStatus.MAX_STEPS:
                return None
            return found

        steps = d.steps + [step]
        go_on = d.may_go_on and d.stored_reply is not None  # no model call in this delivery
        to_send = None if go_on else self.dispatch.step_commands
        committed = self.store.commit_step(
            snap, step, conclude, invalid=invalid, release_lease=d.token,
            also=also, uncounted=Uncounted(usage=step.usage + step.lost_usage, cost_usd=step.cost_usd,
                                           spend_tokens=spend.tokens, spend_usd=spend.usd),
            trim=lambda: working_keys(self.store, run, steps),
            send_next=(lambda: to_send(run.id, step.index + 1)) if to_send is not None else None,
        )
        if committed is None:
            self.rt.budgets.store.run(ledger.charge_now(run.spec.tenant, spend))  # paid for, recorded or not
            return FENCED
        self.rt.leases.forget(run.id, d.token)
        metrics.STEPS_TOTAL.labels(outcome.value).inc()
        log.info("step", extra={"run_id": run.id, "step": step.index, "outcome": outcome.value,
                                "tools": [c.name for c in step.tool_calls],
                                "prompt_tokens": step.usage.prompt_tokens,
                                "completion_tokens": step.usage.completion_tokens,
                                "llm_ms": step.llm_ms, "tools_ms": step.tools_ms})
        if not committed.run.status.finished:
            return StepOutcome(outcome, next_step=step.index + 1, next_sent=committed.next_sent, go_on=go_on)
        safeguard = committed.end.safeguard if committed.end is not None else ""
        if safeguard:
            metrics.SAFEGUARDS.labels(safeguard).inc()
        record_finished(committed.run, self.rt, self.dispatch.webhook, steps, trimmed=committed.trimmed,
                        batch_progress=committed.batch_progress)
        return StepOutcome(outcome, safeguard=safeguard or None)

    def _record_cancel(self, run_id: str) -> None:
        """A run cancelled from the CLI or API is counted by the first worker that sees it, once."""
        if (run := self.store.mark_cancel_recorded(run_id)) is not None:
            record_finished(run, self.rt, self.dispatch.webhook)

    def _end(self, run: Run, end: End, only_step: int, outcome: Outcome) -> StepOutcome:
        """End the run without recording a step (a limit before the step, an LLM failure)."""
        finished = self.store.finish(run.id, end.status, end.reason, only_step=only_step)
        if finished is None:
            return FENCED
        metrics.STEPS_TOTAL.labels(Outcome.ENDED.value).inc()
        if end.safeguard:
            metrics.SAFEGUARDS.labels(end.safeguard).inc()
        record_finished(finished, self.rt, self.dispatch.webhook)
        return StepOutcome(outcome, safeguard=end.safeguard or None)


def record_finished(run: Run, rt: Runtime, send_webhook: SendWebhook, steps: list[Step] | None = None, *,
                    trimmed: bool = False,
                    batch_progress: tuple[int, int] | None = None) -> None:
    """Count a finished run and do what follows its end (`steps`: all of its steps, if at hand;
    `trimmed`: its working keys went with its last write; `batch_progress`: its batch's, if read)."""
    metrics.RUNS_TOTAL.labels(run.status.value).inc()
    metrics.RUN_TURNS.labels(run.status.value).observe(run.current_step)
    metrics.RUN_DURATION.labels(run.status.value).observe(max(0.0, (run.finished_at or time.time()) - run.created_at))
    log.info("run finished", extra={"run_id": run.id, "status": run.status.value, "steps": run.current_step})
    after_finish(rt, run, send_webhook, steps, trimmed=trimmed, batch_progress=batch_progress)


def _tool_label(name: str, rt: Runtime) -> str:
    return name if rt.tools.get(name) is not None else "unknown"
