"""What a failed model call does to its run: wait for the provider, or end.

A provider that is down, overloaded or slow (connection refused or reset, a timeout, a 5xx, a 429, its
circuit open) is expected to come back: the step is tried again later, with backoff, for as long as the
run's deadline allows; past it the run ends `timeout`. Only a refusal that no retry can change (a bad
request, a bad key, a model that does not exist: any other 4xx) fails the run, with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from .engine import End
from .models import Run, RunStatus

# The LLMError.outcome of a prompt the provider refused as larger than the model's context window.
CONTEXT_EXCEEDED = "context_exceeded"
# LLMError.outcome values that a later attempt may turn into a reply.
TRANSIENT_OUTCOMES = frozenset({"connection_error", "timeout", "server_error", "rate_limited", "circuit_open"})


@dataclass(frozen=True)
class WaitForProvider:
    """Try the step again in `wait_s` seconds; the run shows it is waiting on the provider meanwhile."""

    wait_s: float


def deadline_of(run: Run, started: float) -> float | None:
    """When the run's deadline passes (epoch seconds): `deadline_at` once a recorded step started its clock,
    else the start of this (first) step plus its wall-time budget; None without one."""
    if run.deadline_at is not None:
        return run.deadline_at
    return None if run.deadline_s is None else started + run.deadline_s


def after_failed_call(run: Run, started: float, now: float, outcome: str, reason: str,
                      wait_s: float) -> WaitForProvider | End:
    """The run's next move when the model call of a step that began at `started` failed with `outcome`
    (`reason` says why, for people), and the provider asks for (or the backoff gives) `wait_s` seconds. The
    wait never reaches the deadline (`deadline_of`): when the provider may not be tried again before it, the
    run ends `timeout` now, with the provider's trouble as the reason (a step delivered at the deadline
    could only say the deadline passed)."""
    if outcome not in TRANSIENT_OUTCOMES:
        return End(RunStatus.FAILED, reason)
    deadline = deadline_of(run, started)
    if deadline is None:
        return WaitForProvider(wait_s)
    if now + wait_s >= deadline:
        return End(RunStatus.TIMEOUT, f"run deadline reached while the model provider was unavailable ({reason})",
                   safeguard="deadline")
    return WaitForProvider(wait_s)
