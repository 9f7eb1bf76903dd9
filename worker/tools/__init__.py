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
before the tool runs; a validation error becomes the observation.
"""

from .registry import REGISTRY, Tool, ToolError, ToolRegistry, tool

__all__ = ["REGISTRY", "Tool", "ToolError", "ToolRegistry", "tool"]

from . import builtin as _builtin  # noqa: E402,F401  (registers calculator, search, python)
