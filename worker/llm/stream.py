"""A streamed chat completion folded back into the completion body it stands for (pure).

Chunks come from the provider, outside our trust boundary: a field of the wrong type is ignored, and the
text kept is bounded, so a provider that streams forever fails the call instead of filling the worker's
memory. The folded body goes through the same validation as a non-streamed one (`parse_completion`).
"""

from __future__ import annotations

from typing import Any

from ..errors import LLMError

__all__ = ["MAX_STREAMED_CHARS", "StreamedCompletion"]

MAX_STREAMED_CHARS = 2_000_000  # far above any max_tokens a step sends


class StreamedCompletion:
    """Add the chunks in order; `body()` is the completion they make up."""

    def __init__(self) -> None:
        self.model: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chars = 0  # text received so far (content, reasoning, call arguments): the estimate of a cut reply

    def add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        self._text(self.content, delta.get("content"))
        self._text(self.reasoning, delta.get("reasoning_content", delta.get("reasoning")))
        calls = delta.get("tool_calls")
        for position, call in enumerate(calls if isinstance(calls, list) else []):
            if isinstance(call, dict):
                self._call(call, position)

    def _text(self, into: list[str], piece: Any) -> None:
        if isinstance(piece, str) and piece:
            self.chars += len(piece)
            if self.chars > MAX_STREAMED_CHARS:
                raise LLMError(f"LLM call failed: the provider streamed more than {MAX_STREAMED_CHARS} characters",
                               1, "malformed")
            into.append(piece)

    def _call(self, call: dict[str, Any], position: int) -> None:
        """A tool call's pieces: its index says which call (its first chunk has the id and name, later ones
        more of the arguments)."""
        given = call.get("index")
        index = given if isinstance(given, int) else position
        slot = self.calls.setdefault(index, {"id": None, "name": [], "arguments": []})
        if isinstance(call.get("id"), str) and call["id"]:
            slot["id"] = call["id"]
        function = call.get("function")
        if isinstance(function, dict):
            self._text(slot["name"], function.get("name"))
            self._text(slot["arguments"], function.get("arguments"))

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {"id": slot["id"], "type": "function",
                 "function": {"name": "".join(slot["name"]), "arguments": "".join(slot["arguments"])}}
                for _, slot in sorted(self.calls.items())]
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        return {"object": "chat.completion", "model": self.model, "choices": [choice], "usage": self.usage}
