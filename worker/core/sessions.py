"""A python session's cells: the run's earlier sandboxed calls, in the order they were made (pure).

With `python_session` on, each python execution first replays these (tools_sandbox/base/session.py), so a
variable set in step 2 is there in step 4. They are read from the run's own recorded steps, which is what
makes the state durable and keeps it inside the run.

A call the sandbox stopped (time limit, memory, quota, no backend) is not replayed: it would only be stopped
again and take the new cell with it. A call that ran and raised is replayed (what it did before raising is
part of the state), and its failure on replay is expected.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .models import Observation, Step

CODE_ARGUMENT = "code"
# tools_sandbox's ErrorKind values of an execution that did not run to its end
STOPPED = frozenset({"timeout", "oom", "protocol_violation", "quota_exceeded", "unknown_tier", "unavailable"})


def replayable(obs: Observation) -> bool:
    facts = obs.sandbox
    return facts is not None and facts.error_kind not in STOPPED and not {"timed_out", "oom_killed"} & set(facts.flags)


def _code(arguments: dict[str, Any] | str) -> str | None:
    """The code of a recorded call's arguments: decoded (parser.parse_tool_reply keeps a string it could not
    decode; such a call was never run), or a plain string, which is the tool's one field."""
    decoded: Any = arguments
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return arguments
    code = decoded.get(CODE_ARGUMENT) if isinstance(decoded, dict) else None
    return code if isinstance(code, str) else None


def earlier_cells(steps: Sequence[Step], before_in_step: Sequence[str]) -> list[tuple[str, bool]]:
    """(code, failed) of each earlier cell: the recorded steps' sandboxed calls, then `before_in_step` (the
    code of this step's sandboxed calls ahead of the one being sent; their outcome is not known yet)."""
    cells: list[tuple[str, bool]] = []
    for step in steps:
        code_by_id = {c.id: _code(c.arguments) for c in step.tool_calls}
        for obs in step.observations:
            code = code_by_id.get(obs.call_id)
            if isinstance(code, str) and replayable(obs):
                cells.append((code, obs.outcome != "ok"))
    cells.extend((code, False) for code in before_in_step)
    return cells
