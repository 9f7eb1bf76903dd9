"""The request a step sends the sandbox task (its answer is a models.SandboxResult, stored at `result_key`).

One model on both sides: the worker builds it (worker/runtime/sandbox_bridge.py), the task validates it
(edges/tasks.py). Its JSON is the Celery message's one argument, so a field is only ever added, with a
default an older sender's message validates with.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .session import SessionCell


class ExecuteRequest(BaseModel):
    """The sandbox task's single argument: what a step sends (worker/runtime/sandbox_bridge.py builds it) and
    what the task reads, and re-sends, with its waits and retries counted."""

    code: str
    tier: str = "standard"
    tenant: str = "default"
    result_key: str
    continue_task: str | None = None
    continue_args: list[Any] = Field(default_factory=list)
    continue_queue: str | None = None
    # The continuation's priority on its queue (the run's: the continuation runs the run's next step); None:
    # the queue's base list (older senders).
    continue_priority: int | None = Field(None, ge=0, le=9)
    # The run's deadline (epoch seconds): a call still waiting in line then gets a quota_exceeded result.
    # None (older senders): queued_at + REACTQ_SANDBOX_WAIT_MAX_S.
    deadline_at: float | None = None
    # When the call was sent (epoch seconds): its place in its tenant's line. None: when first seen here.
    queued_at: float | None = None
    # A key in the sandbox's namespace the task keeps alive while the call waits or runs (the reaper
    # re-sends a lost call only once it has expired); None: no marker.
    pending_key: str | None = None
    # Times the call was re-queued to wait (for the log).
    waits: int = 0
    # When the call first found no backend to run it (epoch seconds), and how often it was sent again since.
    unavailable_since: float | None = None
    unavailable_tries: int = 0
    # A python session's earlier cells (base/session.py), replayed before `code`; None: no session.
    session: list[SessionCell] | None = None

    def wire(self) -> dict[str, Any]:
        """The message's argument: the fields its sender set, in this model's order (what steps have always
        sent; the fields the task counts are added only when it re-sends the call)."""
        return self.model_dump(exclude_unset=True)
