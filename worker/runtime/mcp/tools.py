"""One MCP server tool as a reactq tool: offered under its own name (the server's name before it when
another tool has that name), described and validated by the server's own JSON Schema."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jsonschema
from mcp import types
from pydantic import BaseModel, ConfigDict
from referencing import Registry
from referencing.exceptions import Unresolvable

from ...core.prompts import example_value
from ...errors import InvalidArguments
from ...tools import Tool

MAX_SCHEMA_PROBLEMS = 3


class McpArguments(BaseModel):
    """Arguments checked against the server's schema (McpTool.validate), carried as they are."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class McpTool(Tool):
    server: str = ""
    remote_name: str = ""  # the server's own name for it
    input_schema: str = "{}"  # JSON text (the dataclass is frozen and hashed)

    @property
    def schema(self) -> dict[str, Any]:
        return dict(json.loads(self.input_schema))

    def openai_schema(self) -> dict[str, Any]:
        params = {k: v for k, v in self.schema.items() if k != "$schema"}  # for validation only; some
        # servers of the OpenAI protocol (grammar-constrained ones) refuse keys they do not know
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": params}}

    def text_signature(self) -> str:
        props = self.schema.get("properties", {})
        fields = ", ".join(f"{n}: {p.get('type', 'any')}" for n, p in props.items() if isinstance(p, dict))
        return f"{self.name}({fields}) - {self.description}"

    def validate(self, arguments: dict[str, Any] | str) -> BaseModel:
        if isinstance(arguments, str):
            arguments = self._coerce(arguments)
        schema = self.schema
        # An empty registry: a $ref to anywhere but the schema itself is unresolvable, never fetched.
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(
            schema, registry=Registry())
        try:
            problems = sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.path)))
        except (Unresolvable, RecursionError):
            raise InvalidArguments(f"{self.name}'s arguments could not be checked: its schema has a reference "
                                   "that does not resolve") from None
        if problems:
            said = "; ".join(f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message[:200]}"
                             for e in problems[:MAX_SCHEMA_PROBLEMS])
            raise InvalidArguments(f"invalid arguments for {self.name}: {said}. Expected JSON like "
                                   f"{json.dumps(self._example())}")
        return McpArguments.model_validate(arguments)

    def _coerce(self, raw: str) -> dict[str, Any]:
        """A plain string for a tool with one required string field (as Tool does for its own)."""
        required = self.schema.get("required", [])
        if not raw.lstrip().startswith("{") and len(required) == 1:
            return {required[0]: raw}
        raise InvalidArguments(f"invalid arguments for {self.name}: not a JSON object. Expected JSON like "
                               f"{json.dumps(self._example())}")

    def _example(self) -> dict[str, Any]:
        props = self.schema.get("properties", {})
        return {n: example_value(n, p) for n, p in props.items() if isinstance(p, dict)}


_NAME = re.compile(r"[^A-Za-z0-9_-]")


def offered_names(listed: dict[str, list[types.Tool]], taken: Iterable[str]) -> dict[tuple[str, str], str]:
    """(server, tool) -> the name the model sees: the tool's own name, or `server_tool` when a registered
    tool or another server's tool has that name (in any case). Names the API cannot carry (outside
    [A-Za-z0-9_-], or past 64 characters) are cleaned the same way on every worker."""
    taken = {t.lower() for t in taken}
    counts: dict[str, int] = {}
    for tools in listed.values():
        for t in tools:
            counts[t.name.lower()] = counts.get(t.name.lower(), 0) + 1
    names: dict[tuple[str, str], str] = {}
    for server, tools in listed.items():
        for t in tools:
            clash = t.name.lower() in taken or counts[t.name.lower()] > 1
            names[(server, t.name)] = _NAME.sub("_", f"{server}_{t.name}" if clash else t.name)[-64:]
    return names


def make_tool(server: str, listed: types.Tool, name: str, timeout_s: float, grace_s: float,
              call: Callable[[str, str, dict[str, Any], float], str]) -> McpTool:
    """The reactq tool for `listed`; `call(server, remote_name, arguments, timeout_s)` runs it within
    `timeout_s`, the executor's deadline `grace_s` later being a backstop. Never idempotent: a server
    tool may have effects, so its result is stored the moment it returns."""
    schema = dict(listed.input_schema or {"type": "object"})
    schema.setdefault("type", "object")
    description = (listed.description or listed.title or f"{listed.name} (MCP server {server})").strip()[:1024]

    def run(args: BaseModel) -> str:
        return call(server, listed.name, args.model_dump(), timeout_s)

    return McpTool(name, McpArguments, description, run, timeout_s=timeout_s + grace_s, server=server,
                   remote_name=listed.name, input_schema=json.dumps(schema, sort_keys=True))
