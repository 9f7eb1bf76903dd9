"""The registry's tools and the MCP servers' as one registry: what Runtime.tools is when
REACTQ_MCP_SERVERS names servers. Plans choose among them (worker.tenancy.plans.AllowedTools)."""

from __future__ import annotations

from ...tools import Tool, ToolRegistry
from .hub import McpTools


class ToolsWithMcp(ToolRegistry):
    def __init__(self, base: ToolRegistry, mcp: McpTools) -> None:
        super().__init__()
        self.base, self.mcp = base, mcp

    def _taken(self) -> list[str]:
        return [n for t in self.base.all() for n in (t.name, *t.aliases)]

    def register(self, t: Tool) -> Tool:
        return self.base.register(t)

    def get(self, name: str) -> Tool | None:
        return self.base.get(name) or self.mcp.get(name, self._taken())

    def names(self) -> list[str]:
        """Without listing servers (a worker's start must not start them): those listed so far."""
        return sorted([*self.base.names(), *(t.name for t in self.mcp.listed())])

    def all(self) -> list[Tool]:
        return [*self.base.all(), *self.mcp.tools(self._taken())]

    def load_modules(self, modules: list[str]) -> None:
        self.base.load_modules(modules)
