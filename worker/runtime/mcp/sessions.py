"""One MCP server's connection, on the MCP loop (loop.py): opened on first use, reopened after it broke.

The SDK's transports are async context managers that must be entered and left by the same task, so
each connection is one task (`_hold`) that opens the transport and the session, says it is ready, and
keeps them until told to close; calls from other tasks use the session meanwhile. A call that fails at
the transport (the process died, the connection dropped, no answer by the deadline) marks the
connection broken: the next use closes it (a stdio server's process is stopped) and opens a new one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from contextlib import AsyncExitStack
from typing import Any, TextIO
from urllib.parse import urlsplit

from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from ...config import McpServerSpec
from ...errors import ToolError
from ..webhooks import resolve_target, validate_url

log = logging.getLogger("reactq.mcp")


class ServerConnection:
    def __init__(self, name: str, spec: McpServerSpec, allow_private: bool) -> None:
        self.name, self.spec, self.allow_private = name, spec, allow_private
        self._session: ClientSession | None = None
        self._holder: asyncio.Task[None] | None = None
        self._close: asyncio.Event | None = None
        self._opening: asyncio.Lock | None = None
        self.broken = False
        self.starts = 0  # connections opened (a restart is a second one)

    async def session(self) -> ClientSession:
        """The open session, opening it (again) when there is none or it broke."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._session is not None and not self.broken and self._holder is not None \
                    and not self._holder.done() and not _transport_closed(self._session):
                return self._session
            self._retire()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._close = asyncio.Event()
            self._holder = asyncio.create_task(self._hold(ready, self._close), name=f"mcp-{self.name}")
            self._session = await ready
            self.broken = False
            self.starts += 1
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession], close: asyncio.Event) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(await self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                if not ready.done():
                    ready.set_result(session)
                await close.wait()
        except BaseException as exc:  # the transport failed to open or broke while held
            if not ready.done():
                ready.set_exception(_unreachable(self.name, exc))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %s: connection ended (%s)", self.name, exc.__class__.__name__)
            self.broken = True
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _transport(self, stack: AsyncExitStack) -> Any:
        """The transport's context manager; an HTTP server's client is closed with the connection."""
        spec = self.spec
        if spec.command:
            # the SDK gives it PATH, HOME, USER, LOGNAME, SHELL and TERM, and `env`: none of the worker's settings
            return stdio_client(StdioServerParameters(command=spec.command[0], args=spec.command[1:], env=spec.env),
                                errlog=_server_errlog())
        assert spec.url is not None
        validate_url(spec.url)
        parts = urlsplit(spec.url)
        await asyncio.to_thread(  # a name lookup, off the loop that serves every server
            resolve_target, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
            self.allow_private or spec.allow_private)
        client = await stack.enter_async_context(create_mcp_http_client(headers=dict(spec.headers)))
        return streamable_http_client(spec.url, http_client=client)

    async def list_tools(self) -> list[types.Tool]:
        session = await self.session()
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._guard(session.list_tools(params=params))
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        session = await self.session()
        result = await self._guard(session.call_tool(tool, arguments))
        if not isinstance(result, types.CallToolResult):
            raise ToolError(f"{tool} asked for something this agent cannot give (input); it was not run",
                            "mcp_unsupported")
        return result

    async def _guard(self, awaitable: Any) -> Any:
        """Await a request; a transport failure or cancellation (the deadline) marks the connection broken.
        An error the server answered with (a JSON-RPC error) leaves it open."""
        try:
            return await awaitable
        except ToolError:
            raise
        except asyncio.CancelledError:
            self.broken = True  # a request abandoned mid-way (a hung server): start clean next time
            self._retire()
            raise
        except Exception as exc:
            if _is_protocol_answer(exc):
                raise ToolError(f"the server refused the call: {_message_of(exc)}", "mcp_error") from None
            self.broken = True
            raise _unreachable(self.name, exc) from None

    async def abandon(self) -> None:
        """A call here passed its deadline: the server may be hung; the next use starts a fresh one."""
        self.broken = True
        self._retire()

    def _retire(self) -> asyncio.Task[None] | None:
        """Let go of the connection at once; it closes in the background (a stdio server's process is
        stopped), so that no call waits for an old connection to end."""
        holder, close = self._holder, self._close
        self._session, self._holder, self._close = None, None, None
        if holder is None or close is None:
            return None
        close.set()
        return asyncio.get_running_loop().create_task(_closed(holder))

    async def aclose(self) -> None:
        closing = self._retire()
        if closing is not None:
            await closing


async def _closed(holder: asyncio.Task[None]) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(holder), 5.0)
    except BaseException:  # a transport that will not close in time is cancelled
        holder.cancel()


def _transport_closed(session: ClientSession) -> bool:
    """Whether the session's transport has closed (a server that died between calls): a request would
    fail unsent. Read from the SDK's dispatcher (not public API: an SDK without it reads as open, and the
    call's failure then marks the connection broken)."""
    return bool(getattr(getattr(session, "_dispatcher", None), "_closed", False))


def _is_protocol_answer(exc: Exception) -> bool:
    error = getattr(exc, "error", None)
    return isinstance(error, types.ErrorData) and error.code != types.CONNECTION_CLOSED


def _message_of(exc: Exception) -> str:
    error = getattr(exc, "error", None)
    return str(getattr(error, "message", "")).strip()[:300] or "no reason given"


def _unreachable(name: str, exc: BaseException) -> ToolError:
    log.warning("MCP server %s unavailable: %s", name, exc, exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)
    return ToolError(f"the MCP server {name!r} is not available right now", "mcp_unavailable")


def _server_errlog() -> TextIO:
    """Where a stdio server's stderr goes: the process's own stderr (a worker's sys.stderr is Celery's
    logging proxy, which a child process cannot write to)."""
    real = sys.__stderr__
    try:
        if real is not None:
            real.fileno()
            return real
    except (AttributeError, OSError, ValueError):
        pass
    return open(os.devnull, "w")  # noqa: SIM115 - kept for the process's life
