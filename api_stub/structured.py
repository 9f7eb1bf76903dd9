"""Structured answers in the stub (pure): when a request carries an output schema, the stub's final answer
becomes a JSON object that fits it, as a model asked for one would write it.

Where the schema comes from: in tools mode, the parameters of the offered `final_answer` tool (the answer is
a call of it; with `tool_choice: "none"` the object is the reply's text); in text mode, the JSON Schema the
system prompt shows after "JSON Schema validates:" (the answer is `Final Answer: {...}`).

The object is made from the schema and the answer the stub would have given in prose (`fill`): a string is
that answer, a number its last number, an enum the value the answer names, and so on. A schema it cannot
fit (a `multipleOf` the number misses, say) gets the same object each time, as a model that cannot do better."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from api_stub.tokens import message_text

FINAL_TOOL = "final_answer"
_PROMPT_MARKER = "JSON Schema validates:"
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
_NEGATIVE = re.compile(r"\b(no|not|false|never|none)\b", re.I)
_MAX_DEPTH = 8


def offered_schema(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> dict[str, Any] | None:
    """The output schema of this request, or None if it has none."""
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == FINAL_TOOL:
            params = function.get("parameters")
            return dict(params) if isinstance(params, Mapping) else {}
    if tools:
        return None
    for message in messages:
        if message.get("role") != "system":
            continue
        text = message_text(message)
        at = text.find(_PROMPT_MARKER)
        if at < 0:
            continue
        try:
            schema, _ = json.JSONDecoder().raw_decode(text[at + len(_PROMPT_MARKER):].lstrip())
        except ValueError:
            return None
        return schema if isinstance(schema, dict) else None
    return None


def other_tools(tools: Sequence[Any] | None) -> list[Any] | None:
    """The tools offered beside `final_answer` (what the stub plans its calls with)."""
    if tools is None:
        return None
    return [t for t in tools if not (isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
                                     and t["function"].get("name") == FINAL_TOOL)]


def fill(schema: Any, answer: str, root: Mapping[str, Any] | None = None, depth: int = 0) -> Any:
    """A value for `schema` made from the prose `answer` (local `$ref`s followed, depth bounded)."""
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return answer
    root = root if root is not None else schema
    if isinstance(ref := schema.get("$ref"), str) and ref.startswith("#"):
        return fill(_pointer(root, ref), answer, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        named = [v for v in schema["enum"] if str(v).lower() in answer.lower()]
        return (named or schema["enum"])[0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return fill(schema[key][0], answer, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        return {name: fill(sub, answer, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems") or 1))
        return [fill(schema.get("items", {}), answer, root, depth + 1) for _ in range(min(count, 8))]
    if kind in ("number", "integer"):
        return _number(schema, answer, integer=kind == "integer")
    if kind == "boolean":
        return _NEGATIVE.search(answer) is None
    if kind == "null":
        return None
    text = answer
    if isinstance(schema.get("maxLength"), int):
        text = text[: schema["maxLength"]]
    return text


def _number(schema: Mapping[str, Any], answer: str, integer: bool) -> int | float:
    found = _NUMBER.findall(answer)
    value = float(found[-1].replace(",", "")) if found else 0.0
    for low in ("minimum", "exclusiveMinimum"):
        if isinstance(schema.get(low), int | float) and value < schema[low]:
            value = float(schema[low])
    for high in ("maximum", "exclusiveMaximum"):
        if isinstance(schema.get(high), int | float) and value > schema[high]:
            value = float(schema[high])
    return int(round(value)) if integer or value.is_integer() else value


def _pointer(root: Mapping[str, Any], ref: str) -> Any:
    node: Any = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, Mapping) else None
    return node
