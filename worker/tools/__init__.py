"""Tools the agent can call, and the registry that validates their arguments.

Register your own tool with a pydantic argument model::

    from pydantic import BaseModel
    from worker.tools import tool

    class WeatherArgs(BaseModel):
        city: str

    @tool("weather", WeatherArgs, "Current weather for a city.")
    def weather(args: WeatherArgs) -> str:
        return f"sunny in {args.city}"

and list its module in REACTQ_TOOL_MODULES so every worker imports it. Arguments are validated
before the tool runs; a validation error becomes the observation. Every call has a deadline:
`@tool(..., timeout_s=10)` (default REACTQ_TOOL_TIMEOUT_S, 30 s); a call past it becomes a `timeout`
observation. A CPU-bound tool should say `isolation="process"`: it then runs in a small process pool
beside the worker, where an overrunning call is killed (a thread cannot be; see
worker/runtime/tool_exec.py).
"""

from .registry import REGISTRY, Tool, ToolError, ToolRegistry, tool

__all__ = ["REGISTRY", "Tool", "ToolError", "ToolRegistry", "tool"]

from . import builtin as _builtin  # noqa: E402,F401  (registers calculator, search, python)
