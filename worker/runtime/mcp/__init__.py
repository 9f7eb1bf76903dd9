"""MCP servers as tool sources (REACTQ_MCP_SERVERS): their tools join the registry's, as plans allow.

`McpTools` (hub.py) owns the connections of one worker process, on an event loop thread of its own
(loop.py; the SDK is asyncio, steps run on threads); `McpTool` (tools.py) is one server tool as the
engine sees it; results.py turns a call's result into the text observation the model reads. See
docs/decisions/mcp-servers.md.
"""

from .hub import McpTools
from .tools import McpTool

__all__ = ["McpTool", "McpTools"]
