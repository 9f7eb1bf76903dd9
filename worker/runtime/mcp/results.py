"""An MCP tool result as the text observation a model reads (pure): text parts as they are; images,
audio and binary resources replaced by a line saying what was left out; text resources with their URI."""

from __future__ import annotations

import base64
import json
from typing import Any

from mcp import types


def _size(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=False)):,} bytes"
    except ValueError:
        return "unknown size"


def _part(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent):
        return f"[an image ({block.mime_type}, {_size(block.data)}) was left out: images are not passed on]"
    if isinstance(block, types.AudioContent):
        return f"[audio ({block.mime_type}, {_size(block.data)}) was left out: audio is not passed on]"
    if isinstance(block, types.ResourceLink):
        return f"[a link to resource {block.uri} ({block.mime_type or 'unknown type'}) was left out]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        blob = getattr(res, "blob", "")
        return (f"[a binary resource {res.uri} ({res.mime_type or 'unknown type'}, {_size(blob)}) was left out:"
                " binary content is not passed on]")
    kind = getattr(block, "type", type(block).__name__)
    return f"[a {kind} part was left out: this content type is not passed on]"


def observation_text(result: types.CallToolResult) -> str:
    """The result's content parts, one after another; structured content when there are no parts."""
    parts = [_part(b) for b in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) if parts else "(the tool returned nothing)"
