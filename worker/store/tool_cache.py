"""A tenant's idempotent-tool cache: the result of a call to a tool registered cacheable, by tenant, tool
and arguments, kept for `tool_cache_ttl_s`. A step reads it as it acts (with its stored reply, in one
round trip: scratch.StepScratch.prepare_act) and writes what it ran fresh with the step it records."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import keys
from .cas import Command


def entry_key(tenant: str, tool: str, arguments: dict[str, Any]) -> str:
    """The key of one (tool, arguments) result in `tenant`'s cache."""
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:32]
    return keys.tool_cache(tenant, tool, digest)


def cache_commands(tenant: str, entries: list[tuple[str, dict[str, Any], str]], ttl_s: int) -> list[Command]:
    """Writes that put (tool, arguments, content) results in `tenant`'s idempotent-tool cache."""
    if ttl_s <= 0:
        return []
    return [("SET", entry_key(tenant, tool, arguments), content, "EX", ttl_s) for tool, arguments, content in entries]
