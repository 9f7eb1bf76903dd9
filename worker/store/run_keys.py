"""The keys of one run, enumerated from its record and steps: all of them (to delete a run) or the
working keys a finished run no longer needs."""

from __future__ import annotations

from ..core.models import Run, Step
from . import keys
from .runs import RunStore


def run_keys(store: RunStore, run: Run) -> list[str]:
    """Every key of a run, as its record and steps name them (no SCAN)."""
    return [keys.run(run.id), keys.steps(run.id), keys.events(run.id), keys.events_compacted(run.id),
            *working_keys(store, run)]


def working_keys(store: RunStore, run: Run, steps: list[Step] | None = None) -> list[str]:
    """The keys a run needs only while a step is in progress: its lease, stored LLM replies, tool and
    sandbox results, sandbox dispatch, pending and approval markers. A finished run's trace has it all.

    `steps`: the run's whole step list, when the caller has it and no step is in progress (a run its
    last step has just finished): then nothing is read back."""
    run_id = run.id
    found = [keys.lease(run_id)]
    current = None
    if steps is None:  # a step may be in progress: its stored reply names calls not in the step list yet
        steps = store.load_steps(run_id)
        current = store.scratch.get_reply(run_id, run.current_step)
    calls_by_step = {s.index: [c.id for c in s.tool_calls] for s in steps}
    if current is not None:
        from ..core.engine import parse_reply  # the step's call-id rules; loaded here: `reactq batch` never asks

        calls_by_step[run.current_step] = [c.id for c in parse_reply(run.mode, current).calls]
    for index in range(run.current_step + 1):
        found += [keys.reply(run_id, index), keys.tool_results(run_id, index), keys.sandbox_pending(run_id, index)]
        for call_id in calls_by_step.get(index, []):
            found += [keys.sandbox_dispatch(run_id, index, call_id), keys.sandbox_result(run_id, index, call_id),
                      keys.approval_counted(run_id, index, call_id)]
    return found
