"""The one place a sandbox result becomes the text a model reads (and the failure type metrics count).

Pure: it takes a validated SandboxResult. The step worker (worker/runtime/sandbox_bridge.py) and the CLI
both call `render`, so the model sees the same words whichever
path produced the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import ErrorKind, SandboxResult

STDERR_TAIL_LINES = 20
PROTOCOL_VIOLATION = "the program interfered with the sandbox's reporting; its result was discarded"
PROTOCOL_VIOLATION_TEXT = f"Error: {PROTOCOL_VIOLATION}."
# The one text of a call no sandbox could run: the `error` of the `unavailable` result the task stores, the
# observation recorded for it (worker/runtime/sandbox_bridge.py) and its run's end reason. Fixed words: the
# cause is in the sandbox worker's log, never in anything a user or the model reads.
UNAVAILABLE_TEXT = "sandbox_unavailable: no sandbox backend could run the code"


@dataclass(frozen=True)
class Rendered:
    """The observation text, its outcome (`ok` | `error` | `quota`) and the failure type (None = ran fine)."""

    text: str
    outcome: str
    error_type: str | None


def _error_type(result: SandboxResult) -> str | None:
    kind = result.error_kind
    if kind is not None and kind is not ErrorKind.OUTPUT_LIMIT:
        return kind.value
    if result.error:
        return "sandbox_error"
    if result.exit_code not in (0, None):
        return "exit_code"
    return None


def render(result: SandboxResult) -> Rendered:
    """Output first, then the exit code and the tail of stderr when something went wrong."""
    error_type = _error_type(result)
    outcome = "ok" if error_type is None else ("quota" if error_type == ErrorKind.QUOTA_EXCEEDED else "error")
    if result.error_kind is ErrorKind.PROTOCOL_VIOLATION:
        # Everything that came through the tampered channel is the program's claim: none of it is shown.
        return Rendered(PROTOCOL_VIOLATION_TEXT, outcome, error_type)
    stdout = result.stdout.rstrip()
    stderr = result.stderr.rstrip()
    lines: list[str] = []
    if result.error:
        lines.append(f"Error: {result.error}")
    elif result.timed_out:
        lines.append(f"Error: the code was stopped at the time limit of its tier ({result.tier}).")
    elif result.oom_killed:
        lines.append(f"Error: the code ran out of memory (tier {result.tier}).")
    if stdout:
        lines.append(stdout)
    if result.exit_code not in (0, None) and not result.error:
        lines.append(f"exit code {result.exit_code}")
    if stderr and (error_type is not None or not stdout):
        tail = "\n".join(stderr.splitlines()[-STDERR_TAIL_LINES:])
        lines.append(f"stderr: {tail}")
    if result.truncated:
        lines.append("…[output truncated at the tier's byte cap]")
    if not lines:
        lines.append("(no output; print() the result)")
    return Rendered("\n".join(lines), outcome, error_type)
