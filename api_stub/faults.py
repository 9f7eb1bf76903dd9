"""Fault injection: what can go wrong with an LLM endpoint, as data.

A `FaultConfig` is set per server (CLI options / `POST /stub/faults`) and can be
overridden per request with the `X-Stub-Faults` header (JSON, same fields).
Every random choice comes from `random.Random(f"{seed}:{n}")` where n is the
server's request counter, so a run of requests is reproducible given its seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api_stub.brain import Reply

__all__ = ["FaultConfig", "FaultDecision", "decide", "hallucinate", "malform", "merge_faults"]

class FaultConfig(BaseModel):
    """Which faults a stub server injects. All rates are probabilities in [0, 1]; all default off.

    Each field maps to a CLI option of `reactq stub` (``--latency-ms`` etc.).
    """

    model_config = ConfigDict(extra="forbid")

    latency_ms: float = Field(default=0.0, ge=0.0, description="fixed delay added to every completion")
    latency_jitter_ms: float = Field(
        default=0.0, ge=0.0, description="uniform random extra delay in [0, latency_jitter_ms]")
    error_rate_429: float = Field(
        default=0.0, ge=0.0, le=1.0, description="share of requests answered 429 with Retry-After headers")
    error_rate_500: float = Field(default=0.0, ge=0.0, le=1.0, description="share answered 500")
    error_rate_503: float = Field(default=0.0, ge=0.0, le=1.0, description="share answered 503")
    retry_after_s: float = Field(
        default=1.0, ge=0.0, description="value of Retry-After (seconds) / retry-after-ms on a 429")
    chunk_delay_ms: float = Field(
        default=0.0, ge=0.0, description="a slow model: the delay before each streamed chunk after the first; "
                                         "a request that does not stream waits for all of them, then gets the answer "
                                         "(0: a stream's chunks are sent together, in one body)")
    timeout_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="share held for timeout_s then dropped without a reply")
    timeout_s: float = Field(default=30.0, ge=0.0, description="how long a 'timeout' request is held")
    malformed_rate: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="share of replies that follow neither protocol (garbage, truncated tool JSON)")
    hallucinate_rate: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="text mode: share of Action replies followed by a fake Observation and a wrong "
                    "Final Answer (stop sequences still cut it)")
    fail_first_n: int = Field(
        default=0, ge=0, description="the first N completion requests of the server fail with fail_status")
    fail_status: int = Field(default=500, ge=400, le=599, description="status used by fail_first_n")
    seed: int = Field(default=0, description="seed of the per-request random choices")
    fail_models: list[str] = Field(
        default_factory=list, description="requests naming one of these models are answered 503 (model routing)")
    rpm_limit: int = Field(
        default=0, ge=0, description="server-side requests-per-minute limit (0: none); over it, 429 + Retry-After")
    tpm_limit: int = Field(
        default=0, ge=0, description="server-side tokens-per-minute limit (0: none); over it, 429 + Retry-After")
    limit_burst_s: float = Field(
        default=1.0, ge=0.0, description="burst tolerance of rpm_limit and tpm_limit, in seconds of the budget")
    limit_window_s: float = Field(
        default=0.0, ge=0.0, le=60.0,
        description="0: rpm_limit and tpm_limit are GCRA cells with limit_burst_s; > 0: fixed windows of this "
                    "many seconds aligned to the wall clock, each admitting limit x window / 60 (rounded down)")


def merge_faults(base: FaultConfig, header: str | None) -> FaultConfig:
    """`base` with the fields given in an `X-Stub-Faults` header (JSON object) replaced.

    Raises ValueError (or pydantic's ValidationError, a ValueError) on a bad header.
    """
    if not header:
        return base
    overrides: Any = json.loads(header)
    if not isinstance(overrides, dict):
        raise ValueError("X-Stub-Faults must be a JSON object")
    return FaultConfig.model_validate({**base.model_dump(), **overrides})


@dataclass(frozen=True)
class FaultDecision:
    """What happens to one request: delay, then maybe an error status, a drop, or a spoiled reply."""

    latency_s: float = 0.0
    status: int | None = None
    timeout: bool = False
    malformed: bool = False
    hallucinate: bool = False
    variant: int = 0


def decide(config: FaultConfig, counter: int) -> FaultDecision:
    """The fate of the `counter`-th completion request (0-based) of a server."""
    rng = random.Random(f"{config.seed}:{counter}")
    # Always draw the same sequence so one rate never shifts another's choices.
    jitter, u_error, u_malformed, u_hallucinate, variant = (
        rng.random(), rng.random(), rng.random(), rng.random(), rng.randrange(1 << 16))
    latency = (config.latency_ms + jitter * config.latency_jitter_ms) / 1000.0
    if counter < config.fail_first_n:
        return FaultDecision(latency_s=latency, status=config.fail_status, variant=variant)
    edge = config.timeout_rate
    if u_error < edge:
        return FaultDecision(latency_s=latency, timeout=True, variant=variant)
    for status, rate in ((429, config.error_rate_429), (500, config.error_rate_500),
                         (503, config.error_rate_503)):
        edge += rate
        if u_error < edge:
            return FaultDecision(latency_s=latency, status=status, variant=variant)
    return FaultDecision(
        latency_s=latency,
        malformed=u_malformed < config.malformed_rate,
        hallucinate=u_hallucinate < config.hallucinate_rate,
        variant=variant,
    )


_GARBAGE = (
    "I think I should maybe look at this from another angle, hmm",
    "<|im_start|>assistant\n}}]{\"tool\": calc",
    "Thought: Let me think.\nAction Input: the expression\n(no action)",
    "\u2581\u2581 ### ::: \u00bf?",
)


def malform(reply: Reply, variant: int) -> Reply:
    """A reply that follows neither protocol: truncated tool-call JSON, or text with no Action/Answer."""
    if reply.tool_calls:
        broken = tuple(replace(call, arguments=call.arguments[: max(1, len(call.arguments) // 2)])
                       for call in reply.tool_calls)
        return replace(reply, tool_calls=broken)
    if reply.mode == "text" and "Action Input:" in (reply.content or "") and variant % 2 == 0:
        content = reply.content or ""
        cut = content.index("Action Input:") + len("Action Input:") + 12
        return replace(reply, content=content[:cut])
    return Reply(content=_GARBAGE[variant % len(_GARBAGE)], tool_calls=(), finish_reason="stop",
                 mode=reply.mode)


def hallucinate(reply: Reply) -> Reply:
    """Text mode: after the Action lines, invent an Observation and a wrong Final Answer."""
    content = reply.content or ""
    if reply.mode != "text" or "Action:" not in content:
        return reply
    fake = "\nObservation: 999999\nThought: I now know the final answer\nFinal Answer: 999999"
    return replace(reply, content=content + fake)

