"""The MCP servers of one worker process: listed on first use, called with a deadline, closed with it.

Names are decided over every configured server's tools at once (tools.offered_names), so that each
worker offers the same name for the same tool whichever tenant asked first; a server that could not
be listed is tried again after RETRY_LISTING_S (its tools are missing meanwhile, and a step does not
wait for it again).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from mcp import types

from ...config import McpServerSpec
from ...errors import ToolError
from .loop import LoopThread
from .results import observation_text
from .sessions import ServerConnection
from .tools import McpTool, make_tool, offered_names

log = logging.getLogger("reactq.mcp")

RETRY_LISTING_S = 30.0
CLOSE_WAIT_S = 5.0
# The tool executor's deadline is this much longer than the call's: the call's own deadline ends it
# first, with the connection let go before the step goes on (worker/runtime/tool_exec.py's would leave
# a thread waiting and race the step's next call to the same server).
EXECUTOR_GRACE_S = 2.0


class McpTools:
    def __init__(self, servers: dict[str, McpServerSpec], *, timeout_s: float, allow_private: bool = False) -> None:
        self.specs = servers
        self.timeout_s = timeout_s  # a call's deadline unless its server's entry sets timeout_s
        self._allow_private = allow_private
        self._lock = threading.Lock()  # listing and naming
        self._connecting = threading.Lock()  # the loop thread and the connections' table
        self._loop: LoopThread | None = None
        self._connections: dict[str, ServerConnection] = {}
        self._listed: dict[str, list[types.Tool]] = {}
        self._failed_at: dict[str, float] = {}
        self._tools: dict[str, McpTool] = {}  # offered name (lower case) -> tool
        self._taken: frozenset[str] = frozenset()
        self._closed = False

    # --- the tools ------------------------------------------------------------------------------
    def tools(self, taken: Iterable[str]) -> list[McpTool]:
        """Every listed server's tools (listing those not listed yet), named around `taken` (the
        registry's own names and aliases)."""
        self._list(frozenset(t.lower() for t in taken))
        return [self._tools[k] for k in sorted(self._tools)]

    def listed(self) -> list[McpTool]:
        """The tools known so far, without listing anything."""
        with self._lock:
            return [self._tools[k] for k in sorted(self._tools)]

    def get(self, name: str, taken: Iterable[str]) -> McpTool | None:
        self._list(frozenset(t.lower() for t in taken))
        with self._lock:
            return self._tools.get(name.strip().lower())

    def _list(self, taken: frozenset[str]) -> None:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            due = [n for n in self.specs if n not in self._listed
                   and now - self._failed_at.get(n, -RETRY_LISTING_S) >= RETRY_LISTING_S]
            if not due and taken == self._taken:
                return
            if due:
                loop = self._ensure_loop()
                start_s = max(self.specs[n].start_timeout_s for n in due)
                try:
                    found = loop.run(self._list_all(due), start_s + 1)
                except TimeoutError:
                    found = {}
                for name in due:
                    if name in found:
                        self._listed[name] = found[name]
                        self._failed_at.pop(name, None)
                    else:
                        self._failed_at[name] = now
            self._taken = taken
            self._name_tools()

    async def _list_all(self, names: list[str]) -> dict[str, list[types.Tool]]:
        async def one(name: str) -> tuple[str, list[types.Tool] | None]:
            try:
                return name, await asyncio.wait_for(self._connection(name).list_tools(),
                                                    self.specs[name].start_timeout_s)
            except (ToolError, TimeoutError) as exc:
                log.warning("MCP server %s: its tools could not be listed (%s)", name, exc.__class__.__name__)
                return name, None
        results = await asyncio.gather(*(one(n) for n in names))
        return {name: tools for name, tools in results if tools is not None}

    def _name_tools(self) -> None:
        names = offered_names(self._listed, self._taken)
        self._tools = {}
        for server, tools in self._listed.items():
            spec = self.specs[server]
            for listed in tools:
                tool = make_tool(server, listed, names[(server, listed.name)], spec.timeout_s or self.timeout_s,
                                 EXECUTOR_GRACE_S, self.call)
                self._tools[tool.name.lower()] = tool

    # --- calls --------------------------------------------------------------------------------
    def call(self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float | None) -> str:
        """Call `tool` on `server` and wait at most its deadline; the text observation, or ToolError."""
        deadline = timeout_s or self.timeout_s
        loop, connection = self._ensure_loop(), self._connection(server)
        try:
            result = loop.run(connection.call(tool, arguments), deadline)
        except TimeoutError:
            loop.run(connection.abandon(), CLOSE_WAIT_S)  # done before the step goes on to its next call
            raise ToolError(f"{tool} took longer than {deadline:g} s and was stopped.", "timeout") from None
        text = observation_text(result)
        if result.is_error:
            raise ToolError(text, "mcp_tool_error")
        return text

    def starts(self, server: str) -> int:
        """How many times this process has opened `server` (a restart after it died is one more)."""
        connection = self._connections.get(server)
        return 0 if connection is None else connection.starts

    # --- the loop and connections ---------------------------------------------------------------
    def _ensure_loop(self) -> LoopThread:
        with self._connecting:
            if self._closed:
                raise ToolError("MCP servers are not available: this worker is stopping", "mcp_unavailable")
            if self._loop is None:
                self._loop = LoopThread()
            return self._loop

    def _connection(self, name: str) -> ServerConnection:
        with self._connecting:
            connection = self._connections.get(name)
            if connection is None:
                connection = ServerConnection(name, self.specs[name], self._allow_private)
                self._connections[name] = connection
            return connection

    def close(self) -> None:
        """Close every connection (stdio servers' processes end) and stop the loop."""
        with self._lock, self._connecting:
            self._closed = True
            loop, self._loop = self._loop, None
        if loop is None:
            return

        async def close_all() -> None:
            await asyncio.gather(*(c.aclose() for c in self._connections.values()), return_exceptions=True)

        try:
            loop.run(close_all(), 10.0)
        except TimeoutError:
            log.warning("MCP servers did not close within 10 s")
        loop.stop()
