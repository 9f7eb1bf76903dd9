"""Turning a sandbox result object (tools_sandbox's SandboxResult, as stored JSON) into an observation."""

from __future__ import annotations

import json

from .models import Observation

STDERR_TAIL_LINES = 20


def observation_from_sandbox(call_id: str, tool: str, raw: bytes | str) -> tuple[Observation, str | None]:
    """The observation the model sees, and the failure type for metrics (None when the code ran fine)."""
    result = json.loads(raw)
    duration = int(result.get("duration_ms") or 0)
    error = result.get("error")
    stdout = (result.get("stdout") or "").rstrip()
    stderr = (result.get("stderr") or "").rstrip()
    lines: list[str] = []
    error_type: str | None = None
    if error:
        error_type = error.split(":", 1)[0].strip() or "sandbox_error"
        lines.append(f"Error: {error}")
    elif result.get("timed_out"):
        error_type = "timeout"
        lines.append(f"Error: the code was stopped at the time limit of its tier ({result.get('tier')}).")
    elif result.get("oom_killed"):
        error_type = "oom"
        lines.append(f"Error: the code ran out of memory (tier {result.get('tier')}).")
    elif result.get("exit_code") not in (0, None):
        error_type = "exit_code"
    if stdout:
        lines.append(stdout)
    if result.get("exit_code") not in (0, None) and not error:
        lines.append(f"exit code {result.get('exit_code')}")
    if stderr and (error_type is not None or not stdout):
        tail = "\n".join(stderr.splitlines()[-STDERR_TAIL_LINES:])
        lines.append(f"stderr: {tail}")
    if result.get("truncated"):
        lines.append("…[output truncated at the tier's byte cap]")
    if not lines:
        lines.append("(no output; print() the result)")
    outcome = "ok" if error_type is None else ("quota" if error_type == "quota_exceeded" else "error")
    return (
        Observation(call_id=call_id, tool=tool, content="\n".join(lines), outcome=outcome, duration_ms=duration),
        error_type,
    )
