"""OpenAI wire shapes: completion bodies, stream chunks, error bodies, stop/max_tokens (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from api_stub.brain import Reply
from api_stub.tokens import count_tokens, truncate_to_tokens

__all__ = ["apply_limits", "completion_body", "completion_tokens", "error_body", "stream_events"]

FINGERPRINT = "fp_reactq_stub"


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An error in OpenAI's shape, which the `openai` client turns into its typed exceptions."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _stops(stop: Any) -> list[str]:
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str) and s]
    return []


def completion_tokens(reply: Reply) -> int:
    """Completion tokens of a reply: its text plus every call's name and arguments."""
    return count_tokens(reply.content) + sum(
        count_tokens(call.name) + count_tokens(call.arguments) for call in reply.tool_calls)


def apply_limits(reply: Reply, stop: Any, max_tokens: int | None) -> Reply:
    """Cut the reply at the first stop sequence (finish "stop") and at `max_tokens` (finish "length")."""
    content = reply.content
    if content:
        cuts = [content.find(s) for s in _stops(stop)]
        cuts = [c for c in cuts if c >= 0]
        if cuts:
            reply = replace(reply, content=content[: min(cuts)])
    if max_tokens is None or max_tokens < 0 or completion_tokens(reply) <= max_tokens:
        return reply
    budget = max_tokens
    content = reply.content or ""
    if count_tokens(content) >= budget:
        return replace(reply, content=truncate_to_tokens(content, budget), tool_calls=(),
                       finish_reason="length")
    budget -= count_tokens(content)
    calls = []
    for call in reply.tool_calls:
        need = count_tokens(call.name) + count_tokens(call.arguments)
        if need <= budget:
            calls.append(call)
            budget -= need
            continue
        room = max(budget - count_tokens(call.name), 0)
        calls.append(replace(call, arguments=truncate_to_tokens(call.arguments, room)))
        break
    return replace(reply, tool_calls=tuple(calls), finish_reason="length")


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in reply.tool_calls]
    return message


def completion_body(reply: Reply, *, id_: str, created: int, model: str,
                    usage: dict[str, int]) -> dict[str, Any]:
    """A non-streaming `chat.completion` object."""
    return {
        "id": id_, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "message": _message(reply), "logprobs": None,
                     "finish_reason": reply.finish_reason}],
        "usage": usage,
    }


def _pieces(text: str, size: int = 16) -> Iterator[str]:
    """The text in small slices, as a model streams it (slicing at spaces keeps words whole)."""
    start = 0
    while start < len(text):
        end = text.find(" ", start + size)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def stream_events(reply: Reply, *, id_: str, created: int, model: str, usage: dict[str, int],
                  include_usage: bool) -> Iterator[str]:
    """Server-sent events of a streamed completion, ending with the usage chunk and `[DONE]`."""
    base: dict[str, Any] = {"id": id_, "object": "chat.completion.chunk", "created": created,
                            "model": model, "system_fingerprint": FINGERPRINT}
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\n\n"

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in _pieces(reply.content or ""):
        yield chunk({"content": piece})
    for index, call in enumerate(reply.tool_calls):
        yield chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]})
        for piece in _pieces(call.arguments):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"
