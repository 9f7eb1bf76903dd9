"""api_stub: an OpenAI-compatible chat completions server that plays a deterministic ReAct agent.

It is a separate service, tied to reactq only by the OpenAI wire protocol: it
imports neither `worker` nor `tools_sandbox`. Public API:

- `serve(host, port, faults)` — run the server in the foreground (the `reactq stub` CLI).
- `StubServer(host, port, faults)` — the same in a background thread (`start()`/`stop()`, `.base_url`).
- `create_app(faults)` — the FastAPI application.
- `FaultConfig` — fault injection settings.
- `respond(messages, tools)` — the pure "model" behind the server.
"""

from api_stub.brain import Reply, ToolCall, respond
from api_stub.faults import FaultConfig
from api_stub.server import StubServer, create_app, serve

__all__ = ["FaultConfig", "Reply", "StubServer", "ToolCall", "create_app", "respond", "serve"]
