"""One ReAct step of one run, end to end: the thin I/O shell around the pure engine.

A step task for step n may run more than once (redelivery, the reaper, a sandbox continuation).
Each run makes progress from what is stored: the LLM reply of step n, each tool result, each
sandbox dispatch. The step is recorded exactly once, by a transaction fenced on the step number.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import keys, metrics
from .celery_app import STEP_TASK, STEPS_QUEUE
from .core import engine, prompts
from .core.engine import Act, End, Final, PlannedCall, Retry
from .core.models import LLMReply, Mode, Observation, Run, RunStatus, Step, ToolCall
from .core.parser import TEXT_STOP_SEQUENCES, ParsedTurn, parse_text, parse_tool_reply
from .core.pricing import cost_usd
from .errors import LLMError, ToolError
from .runtime import Runtime
from .sandbox_bridge import observation_from_sandbox

log = logging.getLogger("reactq.step")


@dataclass
class Dispatcher:
    """How the runner enqueues work (Celery in production; tests may record instead)."""

    next_step: Callable[[str, int], None]
    sandbox: Callable[[dict[str, Any]], None]


class StepRunner:
    def __init__(self, rt: Runtime, dispatch: Dispatcher) -> None:
        self.rt = rt
        self.store = rt.store
        self.dispatch = dispatch

    def run_step(self, run_id: str, index: int) -> str:
        """Make progress on step `index` of a run. Returns the step outcome (for metrics and tests)."""
        leases = self.rt.leases
        token = leases.new_token()
        acquired, run, steps, stored = self.store.lease_and_load(run_id, index, token, leases.ttl_ms)
        if run is not None and run.status == RunStatus.CANCELLED and not run.cancel_recorded:
            self._record_cancel(run_id)
        fenced = run is None or run.status.finished or run.current_step != index
        if not acquired:
            # another delivery (or the step before, finishing) holds the run's lease
            return "fenced" if fenced else "busy"
        leases.hold(run_id, token)
        self._next_step: int | None = None
        try:
            if fenced or run is None:
                return "fenced"
            outcome = self._run_step(run, index, steps, stored)
        finally:
            leases.release(run_id, token)
        # Enqueue the next step only once the lease is gone: sent earlier, it could start (on another
        # thread or worker) while this step still held the lease, be fenced, and strand the run.
        if self._next_step is not None:
            self.dispatch.next_step(run_id, self._next_step)
        return outcome

    def _run_step(self, run: Run, index: int, steps: list[Step], stored: LLMReply | None) -> str:
        limits = self.rt.limits
        started = time.time()
        if (end := engine.precheck(run, started, limits)) is not None:
            self._end(run, end, only_step=index)
            return "ended"
        if run.status == RunStatus.QUEUED:
            run = self.store.mark_running(run.id, index) or run

        try:
            reply = stored or self._reply(run, steps, index)
        except LLMError as exc:
            self._end(run, End(RunStatus.FAILED, str(exc)), only_step=index)
            return "llm_failed"

        turn = self._parse(run.mode, reply)
        for warning in turn.warnings:
            log.debug("parser warning %s", warning, extra={"run_id": run.id, "step": index})
        decision = engine.decide(run, steps, turn, self.rt.tools, limits)
        model = reply.routed_model or run.model
        step = Step(
            index=index, thought=turn.thought, raw_output=reply.content, usage=reply.usage,
            cost_usd=cost_usd(model, reply.usage, self.rt.settings.prices_per_mtok),
            llm_ms=reply.duration_ms, model=model, fallback_from=reply.fallback_from, started_at=started,
        )

        if isinstance(decision, Final):
            step.final_answer = decision.answer
            return self._commit(run, step, "final_answer")
        if isinstance(decision, Retry):
            metrics.PARSE_ERRORS.labels(decision.kind).inc()
            step.error = decision.error
            return self._commit(run, step, "invalid_output", invalid=True)
        if isinstance(decision, End):
            metrics.PARSE_ERRORS.labels(turn.error_kind or "loop").inc()
            step.error = decision.reason
            step.tool_calls = turn.calls
            return self._commit(run, step, "ended", end=decision)

        assert isinstance(decision, Act)
        step.tool_calls = turn.calls
        observations = self._execute(run, index, decision, turn.calls)
        if observations is None:
            self.store.mark_running(run.id, index, waiting_on="sandbox")
            return "waiting"
        step.observations = observations
        step.tools_ms = sum(o.duration_ms for o in observations)
        return self._commit(run, step, "tool_calls")

    # --- the LLM reply ----------------------------------------------------------------------
    def _reply(self, run: Run, steps: list[Step], index: int) -> LLMReply:
        """Ask the model, and store the reply before anything uses it."""
        s = self.rt.settings
        tools = self.rt.tools.all()
        messages, compacted = prompts.build_messages(
            run.mode, run.spec.question, steps, tools, context_budget_tokens=s.context_budget_tokens,
            keep_recent_steps=s.keep_recent_steps, reflect_every=s.reflect_every,
        )
        options: dict[str, Any] = {"model": run.model, "temperature": s.llm_temperature}
        if run.mode == Mode.TOOLS:
            options["tools"] = [t.openai_schema() for t in tools]
        else:
            options["stop"] = TEXT_STOP_SEQUENCES[:4]
        reply = self.rt.llm.chat(messages, **options)
        model = reply.routed_model or run.model
        tenant = metrics.tenant_label(run.spec.tenant, s.tenants)
        metrics.LLM_TOKENS.labels(model, "prompt", tenant).inc(reply.usage.prompt_tokens)
        metrics.LLM_TOKENS.labels(model, "completion", tenant).inc(reply.usage.completion_tokens)
        metrics.LLM_COST.labels(model, tenant).inc(cost_usd(model, reply.usage, s.prices_per_mtok))
        if compacted:
            metrics.SAFEGUARDS.labels("context_compacted").inc()
            log.info("context compacted", extra={"run_id": run.id, "step": index, "compacted_steps": compacted})
        return self.store.save_reply(run.id, index, reply)

    @staticmethod
    def _parse(mode: Mode, reply: LLMReply) -> ParsedTurn:
        turn = parse_tool_reply(reply.content, reply.tool_calls) if mode == Mode.TOOLS else parse_text(reply.content)
        turn.calls = engine.unique_call_ids(turn.calls)
        return turn

    # --- tools --------------------------------------------------------------------------------
    def _execute(self, run: Run, index: int, act: Act, calls: list[ToolCall]) -> list[Observation] | None:
        """Observations in the order the model asked, or None while sandboxed calls are pending."""
        by_id: dict[str, Observation] = {o.call_id: o for o in act.rejected}
        for obs in act.rejected:
            metrics.TOOL_CALLS.labels(_tool_label(obs.tool, self.rt), obs.outcome).inc()
        pending = False
        for planned in act.planned:
            obs = self.store.get_tool_result(run.id, index, planned.call.id)
            if obs is None and planned.sandboxed:
                obs = self._sandbox_result(run, index, planned)
                pending = pending or obs is None
            elif obs is None:
                obs = self.store.save_tool_result(run.id, index, self._run_inline(planned))
            if obs is not None:
                by_id[planned.call.id] = obs
        if pending:
            return None
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
        return ordered

    def _run_inline(self, planned: PlannedCall) -> Observation:
        tool = self.rt.tools.get(planned.tool)
        assert tool is not None
        t0 = time.monotonic()
        cached = (
            self.store.cached_tool_result(tool.name, planned.arguments) if tool.idempotent else None
        )
        outcome = "ok"
        if cached is not None:
            content, outcome = cached, "cached"
        else:
            try:
                content = tool.run(tool.args_model.model_validate(planned.arguments))
                if tool.idempotent:
                    self.store.cache_tool_result(tool.name, planned.arguments, content,
                                                 self.rt.settings.tool_cache_ttl_s)
            except ToolError as exc:
                content, outcome = f"Error: {exc}", "error"
                metrics.TOOL_FAILURES.labels(tool.name, metrics.error_type_label(exc.error_type)).inc()
            except Exception as exc:  # a bug in a tool: the model hears a short reason, the log has it all
                log.exception("tool %s crashed", tool.name)
                content, outcome = f"Error: {tool.name} failed ({exc.__class__.__name__})", "error"
                metrics.TOOL_FAILURES.labels(tool.name, "exception").inc()
        seconds = time.monotonic() - t0
        metrics.TOOL_CALLS.labels(tool.name, outcome).inc()
        metrics.TOOL_DURATION.labels(tool.name).observe(seconds)
        return Observation(call_id=planned.call.id, tool=tool.name, content=content, outcome=outcome,
                           duration_ms=int(seconds * 1000))

    def _sandbox_result(self, run: Run, index: int, planned: PlannedCall) -> Observation | None:
        raw = self.store.get_sandbox_result(run.id, index, planned.call.id)
        if raw is not None:
            obs, error_type = observation_from_sandbox(planned.call.id, planned.tool, raw)
            metrics.TOOL_CALLS.labels(planned.tool, obs.outcome).inc()
            if error_type is not None:
                metrics.TOOL_FAILURES.labels(planned.tool, metrics.error_type_label(error_type)).inc()
            metrics.TOOL_DURATION.labels(planned.tool).observe(obs.duration_ms / 1000)
            return self.store.save_tool_result(run.id, index, obs)
        ttl = self.rt.settings.sandbox_redispatch_after_s
        if self.store.claim_dispatch(run.id, index, planned.call.id, ttl):
            self.dispatch.sandbox({
                "code": planned.arguments.get("code", ""),
                "tier": run.spec.tier,
                "tenant": run.spec.tenant,
                "result_key": keys.sandbox_result(run.id, index, planned.call.id),
                "continue_task": STEP_TASK,
                "continue_args": [run.id, index],
                "continue_queue": STEPS_QUEUE,
            })
        return None

    # --- recording ----------------------------------------------------------------------------
    def _commit(self, run: Run, step: Step, outcome: str, *, invalid: bool = False, end: End | None = None) -> str:
        step.finished_at = time.time()
        limits = self.rt.limits
        ended: list[End] = []  # what apply() decided in the attempt that committed

        def apply(r: Run) -> None:
            r.status = RunStatus.RUNNING
            r.invalid_streak = r.invalid_streak + 1 if invalid else 0
            final = end or engine.after_step(r, step, step.finished_at, limits)
            ended[:] = [final] if final is not None else []
            if final is not None:
                r.status = final.status
                r.error = final.reason or None
                r.answer = step.final_answer
                r.finished_at = step.finished_at

        committed = self.store.commit_step(run.id, step, apply)
        if committed is None:
            return "fenced"
        metrics.STEPS_TOTAL.labels(outcome).inc()
        log.info("step", extra={"run_id": run.id, "step": step.index, "outcome": outcome,
                                "tools": [c.name for c in step.tool_calls],
                                "prompt_tokens": step.usage.prompt_tokens,
                                "completion_tokens": step.usage.completion_tokens,
                                "llm_ms": step.llm_ms, "tools_ms": step.tools_ms})
        if ended and ended[0].safeguard:
            metrics.SAFEGUARDS.labels(ended[0].safeguard).inc()
        if committed.status.finished:
            record_finished(committed)
        else:
            self._next_step = step.index + 1  # sent by run_step after the lease is released
        return outcome

    def _record_cancel(self, run_id: str) -> None:
        """A run cancelled from the CLI or API is counted by the first worker that sees it, once."""

        def mutate(run: Run) -> bool:
            if run.cancel_recorded:
                return False
            run.cancel_recorded = True
            return True

        if (run := self.store.update_run(run_id, mutate)) is not None:
            record_finished(run)

    def _end(self, run: Run, end: End, only_step: int) -> None:
        finished = self.store.finish(run.id, end.status, end.reason, only_step=only_step)
        if finished is not None:
            metrics.STEPS_TOTAL.labels("ended").inc()
            if end.safeguard:
                metrics.SAFEGUARDS.labels(end.safeguard).inc()
            record_finished(finished)


def record_finished(run: Run) -> None:
    metrics.RUNS_TOTAL.labels(run.status.value).inc()
    metrics.RUN_TURNS.labels(run.status.value).observe(run.current_step)
    metrics.RUN_DURATION.labels(run.status.value).observe(max(0.0, (run.finished_at or time.time()) - run.created_at))
    log.info("run finished", extra={"run_id": run.id, "status": run.status.value, "steps": run.current_step})


def _tool_label(name: str, rt: Runtime) -> str:
    return name if rt.tools.get(name) is not None else "unknown"
