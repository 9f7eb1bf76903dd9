"""Offline token counting that looks like a BPE tokenizer's, without downloading one.

`tiktoken` needs to fetch its encodings, which this deployment cannot do, and the
numbers only have to be *realistic* (the engine budgets and meters them), stable
(same text, same count) and cheap. A word costs one token per ~4 characters, each
punctuation mark one token; a chat message adds OpenAI's documented overhead.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["count_tokens", "count_prompt_tokens", "message_text", "truncate_to_tokens"]

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_PIECE = 4
_PER_MESSAGE = 4
_REPLY_PRIMING = 3


def _spans(text: str) -> Iterator[int]:
    """Yield the end offset of every token, in order."""
    for match in _TOKEN.finditer(text):
        start, end = match.span()
        if end - start <= _PIECE:
            yield end
            continue
        yield from range(start + _PIECE, end, _PIECE)
        yield end


@functools.lru_cache(maxsize=512)  # a run's calls repeat its system prompt and earlier turns: counted once each
def count_tokens(text: str | None) -> int:
    """Number of tokens in `text` (0 for None or empty)."""
    if not text:
        return 0
    return sum(1 for _ in _spans(text))


def truncate_to_tokens(text: str, limit: int) -> str:
    """The longest prefix of `text` holding at most `limit` tokens (for `max_tokens`)."""
    if limit <= 0:
        return ""
    for index, end in enumerate(_spans(text), start=1):
        if index == limit:
            return text[:end]
    return text


def message_text(message: Mapping[str, Any] | Any) -> str:
    """The text of a chat message's `content`: a string, a list of parts, or nothing."""
    if not isinstance(message, Mapping):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def count_prompt_tokens(messages: Iterable[Any], tools: Any = None) -> int:
    """Prompt tokens of a chat request: messages (with overhead), their tool calls, the tools schema."""
    total = _REPLY_PRIMING
    for message in messages:
        total += _PER_MESSAGE + count_tokens(message_text(message))
        if isinstance(message, Mapping):
            for key in ("name", "tool_call_id"):
                value = message.get(key)
                if isinstance(value, str):
                    total += count_tokens(value)
            if message.get("tool_calls"):
                total += count_tokens(json.dumps(message["tool_calls"], sort_keys=True, default=str))
    if tools:
        total += count_tokens(json.dumps(tools, sort_keys=True, default=str))
    return total
