"""Token spend in money, from the configured price table (USD per million tokens)."""

from __future__ import annotations

from .models import Usage


def cost_usd(model: str, usage: Usage, prices: dict[str, tuple[float, float]]) -> float:
    prompt_price, completion_price = prices.get(model, (0.0, 0.0))
    return (usage.prompt_tokens * prompt_price + usage.completion_tokens * completion_price) / 1_000_000
