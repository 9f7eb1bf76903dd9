"""The LLM edge's reading of a chat completion body: validated into our reply shape, never trusted."""

from __future__ import annotations

import json

import pytest

from worker.core.models import ToolCall, Usage
from worker.errors import LLMError
from worker.llm import parse_completion


def body(message: dict, **extra: object) -> str:
    return json.dumps({"id": "x", "object": "chat.completion", "model": "m", "created": 1,
                       "choices": [{"index": 0, "message": {"role": "assistant", **message},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}, **extra})


def test_a_text_reply() -> None:
    reply = parse_completion(body({"content": "42"}), attempts=2, duration_ms=5)
    assert (reply.content, reply.tool_calls, reply.model, reply.finish_reason) == ("42", [], "m", "stop")
    assert reply.usage == Usage(prompt_tokens=7, completion_tokens=3)
    assert (reply.attempts, reply.duration_ms) == (2, 5)


def test_tool_calls_keep_their_raw_arguments_and_get_ids_when_missing() -> None:
    reply = parse_completion(body({"content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}},
        {"type": "function", "function": {"name": "search", "arguments": "not json"}},
    ]}))
    assert reply.tool_calls == [ToolCall(id="a", name="calculator", arguments='{"expression": "1+1"}'),
                                ToolCall(id="call-1", name="search", arguments="not json")]


def test_no_choices_is_an_empty_reply_and_missing_usage_counts_zero() -> None:
    reply = parse_completion(json.dumps({"model": "m", "choices": []}))
    assert reply.content is None and reply.finish_reason == "empty" and reply.usage == Usage()


@pytest.mark.parametrize("raw", ["not json", json.dumps({"choices": [{"message": "hi"}]}),
                                 json.dumps({"choices": [{"message": {"content": 5}}]})])
def test_a_malformed_body_is_a_clear_llm_error(raw: str) -> None:
    with pytest.raises(LLMError, match="malformed completion"):
        parse_completion(raw)
