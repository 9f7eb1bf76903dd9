"""A prompt too large for the model: the provider refuses it (the LLM edge's outcome "context_exceeded"),
and the same conversation is sent once more without older observations' bodies (the pure decision:
engine.after_context_exceeded; the compaction: prompts.drop_observation_bodies). Refused again, or with
nothing to drop, the call fails with that outcome and a reason saying so.

What is not wired here: ending such a run with a best-effort answer (the step's LLMError handling in
worker/runtime/runner.py ends it failed with the error; after_context_exceeded's End says how it should
end), and a fallback to a model with a larger window.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import metrics
from ..core.engine import End, after_context_exceeded
from ..core.models import LLMReply
from ..core.prompts import drop_observation_bodies
from ..errors import LLMError
from .client import CONTEXT_EXCEEDED, LLMClient

__all__ = ["ContextGuard"]

log = logging.getLogger("reactq.llm")


class ContextGuard:
    """An LLMClient that answers a context refusal by compacting the conversation and asking once more."""

    def __init__(self, inner: LLMClient) -> None:
        self.inner = inner

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> LLMReply:
        try:
            return self.inner.chat(messages, **options)
        except LLMError as refused:
            if refused.outcome != CONTEXT_EXCEEDED or after_context_exceeded(retried=False) != "compact":
                raise
            compacted, dropped = drop_observation_bodies(messages)
            if not dropped:
                raise self._ended(refused, refused.attempts) from None
            metrics.SAFEGUARDS.labels("context_compacted").inc()
            log.info("context exceeded: older observations dropped", extra={"model": options.get("model"),
                                                                             "dropped": dropped})
            try:
                return self.inner.chat(compacted, **options)
            except LLMError as again:
                if again.outcome != CONTEXT_EXCEEDED:
                    raise
                raise self._ended(again, refused.attempts + again.attempts) from None

    @staticmethod
    def _ended(exc: LLMError, attempts: int) -> LLMError:
        end = after_context_exceeded(retried=True)
        assert isinstance(end, End)
        return LLMError(f"{end.reason} ({exc})", attempts, CONTEXT_EXCEEDED)
