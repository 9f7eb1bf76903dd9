"""The step's side of its exchange with the sandbox: the request it sends (or parks in its tenant's line,
SandboxLine), and the observation the model sees from the stored result object.

The stored JSON crosses a trust boundary (another process wrote it to Redis), so it is validated
as tools_sandbox's SandboxResult before anything reads it; the words the model sees come from
tools_sandbox's one renderer, whichever path produced the result. A result no backend could produce
(`unavailable`: the sandbox task gave up after REACTQ_SANDBOX_UNAVAILABLE_S) is not for the model: its
observation is tools_sandbox's one fixed text for it, with the outcome that ends the run failed with that
text (engine.after_step).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from tools_sandbox import ErrorKind, ExecuteRequest, SandboxResult, SessionCell, load_tiers, render_result
from tools_sandbox.base import keys as sandbox_keys
from tools_sandbox.base.calls import CallStore
from tools_sandbox.base.errors import TierConfigError
from tools_sandbox.base.quotas import QuotaGate
from tools_sandbox.base.render import UNAVAILABLE_TEXT

from ..core.engine import UNAVAILABLE_OUTCOME
from ..core.models import Observation, SandboxFacts
from ..names import STEP_TASK, STEPS_QUEUE
from ..store import keys
from ..store.connection import Client

UNREADABLE = "Error: the sandbox's result could not be read; the code's output is unknown."


def sandbox_request(code: str, *, run_id: str, index: int, call_id: str, tier: str, tenant: str,
                    deadline_at: float | None, queued_at: float,
                    session: list[tuple[str, bool]] | None = None) -> dict[str, Any]:
    """The sandbox task's argument for one call of step `index`: it stores its result where this step reads
    it, then continues the run with the step task. The call waits in its tenant's line (by `queued_at`) until
    a slot frees or the run's deadline passes, keeping the step's pending marker alive meanwhile (the reaper
    reads the marker; tools_sandbox/edges/sandbox_worker.py). `session`: a python session's earlier cells
    (worker/core/sessions.py), (code, failed) each."""
    cells = {} if session is None else {"session": [SessionCell(code=code, failed=failed) for code, failed in session]}
    return ExecuteRequest(
        code=code, tier=tier, tenant=tenant, result_key=keys.sandbox_result(run_id, index, call_id),
        continue_task=STEP_TASK, continue_args=[run_id, index], continue_queue=STEPS_QUEUE,
        deadline_at=deadline_at, queued_at=queued_at, pending_key=keys.sandbox_pending(run_id, index), **cells,
    ).wire()


class SandboxLine:
    """Parks a sandboxed call in its tenant's line when its turn has not come, instead of sending it.

    Its delivery would only park it (tools_sandbox/edges/sandbox_worker.py): a burst of one tenant's calls past
    its tier's concurrency cost a sandbox delivery each for nothing, and most of a batch's calls are such. The
    sandbox workers wake it like any parked call. The quotas are read from the tiers file the sandbox workers
    read (REACTQ_SANDBOX_TIERS_FILE); a call of a tier not in it, or with no deadline, is sent as it is, and its
    delivery decides. Should the two files differ, a call parked here is woken by the sandbox workers' quotas
    within a second (their line pump)."""

    def __init__(self, client: Client, tiers_file: str | None, pending_ttl_s: float, *, on_cluster: bool) -> None:
        if on_cluster:
            sandbox_keys.use_hash_tags(True)  # the quota keys' names, as the sandbox workers use them
        self.gate = QuotaGate(client=client)
        self.gate.start()
        self.calls = CallStore(client)
        self.tiers_file = tiers_file
        self.pending_ttl_s = pending_ttl_s

    def parked(self, request: dict[str, Any]) -> bool:
        """Whether the call (sandbox_request's, as sent) was parked; False: send it now."""
        deadline, arrival = request.get("deadline_at"), request.get("queued_at")
        try:
            tier = load_tiers(self.tiers_file).get(request["tier"])
        except TierConfigError:
            tier = None
        if tier is None or deadline is None or arrival is None:
            return False
        waiting = json.dumps({**request, "waits": 1})
        if self.gate.enter(tier, request["tenant"], ticket=request["result_key"], arrival=arrival, request=waiting,
                           deadline=deadline):
            return False
        self.calls.keep_marker(request.get("pending_key"), self.pending_ttl_s)  # the reaper leaves it be
        return True


def observation_from_sandbox(call_id: str, tool: str, raw: bytes | str,
                             session_cells: int | None = None) -> tuple[Observation, str | None]:
    """The observation the model sees, and the failure type for metrics (None when the code ran fine);
    `session_cells`: in a python session, how many earlier cells the execution replayed first."""
    try:
        result = SandboxResult.model_validate_json(raw)
    except ValidationError:
        obs = Observation(call_id=call_id, tool=tool, content=UNREADABLE, outcome="error", duration_ms=0)
        return obs, "unreadable_result"
    facts = _facts(result).model_copy(update={"session_cells": session_cells})
    if result.error_kind is ErrorKind.UNAVAILABLE:
        obs = Observation(call_id=call_id, tool=tool, content=UNAVAILABLE_TEXT, outcome=UNAVAILABLE_OUTCOME,
                          duration_ms=result.duration_ms, sandbox=facts)
        return obs, ErrorKind.UNAVAILABLE.value
    rendered = render_result(result)
    return (
        Observation(call_id=call_id, tool=tool, content=rendered.text, outcome=rendered.outcome,
                    duration_ms=result.duration_ms, sandbox=facts),
        rendered.error_type,
    )


def _facts(result: SandboxResult) -> SandboxFacts:
    """The result's flags and error kind, kept with the observation (the UI and traces show them)."""
    return SandboxFacts(exit_code=result.exit_code,
                        flags=[f for f in ("timed_out", "oom_killed", "truncated") if getattr(result, f)],
                        error_kind=result.error_kind.value if result.error_kind else None, tier=result.tier,
                        backend=result.backend, cpu_seconds=result.cpu_seconds,
                        memory_peak_bytes=result.memory_peak_bytes)
