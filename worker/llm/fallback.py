"""Model routing: each run names its model; a model that keeps failing hands the step to its fallbacks.

A model's fallbacks are listed in REACTQ_MODELS (`{"gpt-4o": {"fallbacks": ["gpt-4o-mini"]}}`). Only
failures that another model might not have move the step: 5xx replies, timeouts, refused connections,
each after the client's own retries. A 4xx is our request's fault and fails the step on any model.
The reply says which model answered (`routed_model`, `fallback_from`); the step records it in the trace
and prices its tokens at that model's price; `reactq_llm_fallbacks_total{model,fallback}` counts moves.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..config import ModelSpec
from ..core.models import LLMReply
from ..errors import LLMError

# Neither the client (httpx2) nor metrics (prometheus_client) are imported with the module: tenant budgets
# import model_chain in every process, a `reactq batch` too.
if TYPE_CHECKING:
    from .client import LLMClient

__all__ = ["FALLBACK_OUTCOMES", "RoutedLLM", "model_chain"]

log = logging.getLogger("reactq.routing")
FALLBACK_OUTCOMES = frozenset({"server_error", "timeout", "connection_error", "circuit_open"})


def model_chain(models: dict[str, ModelSpec], model: str) -> list[str]:
    """`model`, then its fallbacks in order: every model that may answer a call for it."""
    spec = models.get(model)
    return [model, *(m for m in (spec.fallbacks if spec else []) if m != model)]


class RoutedLLM:
    """An LLMClient that tries the run's model, then its fallbacks, and says which one answered."""

    def __init__(self, inner: LLMClient, models: dict[str, ModelSpec]) -> None:
        self.inner = inner
        self.models = models

    def chain(self, model: str) -> list[str]:
        return model_chain(self.models, model)

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> LLMReply:
        requested = str(options.get("model", ""))
        chain = self.chain(requested)
        for position, model in enumerate(chain):
            try:
                reply = self.inner.chat(messages, **{**options, "model": model})
            except LLMError as exc:
                if exc.outcome not in FALLBACK_OUTCOMES or position == len(chain) - 1:
                    raise
                from .. import metrics

                metrics.LLM_FALLBACKS.labels(model, chain[position + 1]).inc()
                log.warning("model failing; falling back", extra={"model": model, "fallback": chain[position + 1],
                                                                  "outcome": exc.outcome})
                continue
            return reply.model_copy(update={"routed_model": model,
                                            "fallback_from": requested if model != requested else None})
        raise AssertionError("unreachable: the chain is never empty")
