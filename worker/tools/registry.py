"""The tool registry: names, schemas, argument validation."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ValidationError

from ..core.prompts import example_value
from ..errors import InvalidArguments, ToolError

__all__ = ["InvalidArguments", "Tool", "ToolError", "ToolRegistry", "REGISTRY", "tool", "ISOLATIONS"]

# Where an inline tool's call runs (worker/runtime/tool_exec.py): "thread", a thread of its own that the step
# stops waiting for at the deadline (for I/O-bound tools); "process", a small pool of processes beside the
# worker, where a call past its deadline is killed (for CPU-bound tools: a thread cannot be stopped, and a
# big-int or C loop holds the GIL).
ISOLATIONS = ("thread", "process")


@dataclass(frozen=True)
class Tool:
    name: str
    args_model: type[BaseModel]
    description: str
    func: Callable[[Any], str] | None = None
    sandboxed: bool = False  # runs on the reactq.sandbox queue, not inside the step
    idempotent: bool = False  # no effects: a call may run again, and its result is recorded with the step
    requires_approval: bool = False  # each call waits for a person (`reactq approve`) before it runs
    cached: bool = False  # results are shared across a tenant's runs by (tool, arguments) for REACTQ_TOOL_CACHE_TTL_S
    timeout_s: float | None = None  # a call's deadline; None: REACTQ_TOOL_TIMEOUT_S (default 30 s)
    isolation: str = "thread"  # one of ISOLATIONS; a "process" tool's func must be importable (module level)
    aliases: tuple[str, ...] = ()  # other names a model may call it by (`calc`); never offered to the model
    returns: str = ""  # what a call gives back, for the system prompt
    when: str = ""  # when the model should use it, for the system prompt

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"tool {self.name!r}: isolation must be one of {ISOLATIONS}, not {self.isolation!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"tool {self.name!r}: timeout_s must be above 0")

    def openai_schema(self) -> dict[str, Any]:
        return _openai_schema(self.name, self.description, self.args_model)

    def text_signature(self) -> str:
        fields = ", ".join(
            f"{name}: {getattr(f.annotation, '__name__', str(f.annotation))}"
            for name, f in self.args_model.model_fields.items()
        )
        return f"{self.name}({fields}) - {self.description}"

    def validate(self, arguments: dict[str, Any] | str) -> BaseModel:
        """Validate what the model sent. A plain string is accepted for a tool with one required field."""
        if isinstance(arguments, str):
            arguments = self._coerce_string(arguments)
        try:
            return self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidArguments(
                f"invalid arguments for {self.name}: {problems}. Expected JSON like "
                f"{json.dumps(self._example())}"
            ) from None

    def _coerce_string(self, raw: str) -> dict[str, Any]:
        if raw.lstrip().startswith("{"):  # meant as a JSON object but unreadable; same rule as the text parser
            raise InvalidArguments(
                f"invalid arguments for {self.name}: not a valid JSON object. Expected JSON like "
                f"{json.dumps(self._example())}"
            )
        required = [n for n, f in self.args_model.model_fields.items() if f.is_required()]
        if len(required) == 1:
            return {required[0]: raw}
        raise InvalidArguments(
            f"{self.name} takes a JSON object with fields {list(self.args_model.model_fields)}, got a string"
        )

    def _example(self) -> dict[str, Any]:
        """Every field with a plausible value from its schema (never "...": a model copies the example)."""
        params = self.openai_schema()["function"].get("parameters", {})
        return {name: example_value(name, prop) for name, prop in params.get("properties", {}).items()}

    def run(self, args: BaseModel) -> str:
        if self.func is None:
            raise ToolError(f"{self.name} cannot run inline", "not_inline")
        return self.func(args)


@lru_cache(maxsize=1024)
def _openai_schema(name: str, description: str, args_model: type[BaseModel]) -> dict[str, Any]:
    """Built once per tool: pydantic's schema generation is costly and the schema never changes."""
    params = args_model.model_json_schema()
    params.pop("title", None)
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._aliases: dict[str, str] = {}  # alias (lower case) -> the tool's key in _tools

    def register(self, t: Tool) -> Tool:
        """Add `t`, replacing a tool of the same name. A name wins over another tool's alias (which is
        dropped: a user's tool called `lookup` is not refused for the built-in search's alias); an alias that
        is already another tool's name or alias is refused (ValueError): a call must never reach a tool it
        did not mean."""
        key = t.name.strip().lower()
        aliases = {a.strip().lower() for a in t.aliases} - {key}
        if "" in aliases:
            raise ValueError(f"tool {t.name!r}: an alias is empty")
        for n in sorted(aliases):
            owner = n if n in self._tools else self._aliases.get(n)
            if owner is not None and owner != key:
                raise ValueError(f"tool {t.name!r}: {n!r} is already the name or an alias of tool "
                                 f"{self._tools[owner].name!r}; choose another name or alias")
        self._aliases = {a: k for a, k in self._aliases.items() if k != key and a != key} | dict.fromkeys(aliases, key)
        self._tools[key] = t
        return t

    def get(self, name: str) -> Tool | None:
        """The tool called `name` or having it as an alias, in any case."""
        key = name.strip().lower()
        return self._tools.get(self._aliases.get(key, key))

    def names(self) -> list[str]:
        return sorted(t.name for t in self._tools.values())

    def refusal(self, name: str) -> str | None:
        """Every registered tool is available (a plan's view, `worker.tenancy.plans.AllowedTools`, refuses some)."""
        return None

    def all(self) -> list[Tool]:
        return [self._tools[n] for n in sorted(self._tools)]

    def load_modules(self, modules: list[str]) -> None:
        """Import users' tool modules (REACTQ_TOOL_MODULES); importing registers their tools."""
        for module in modules:
            importlib.import_module(module)


REGISTRY = ToolRegistry()


def tool(
    name: str,
    args_model: type[BaseModel],
    description: str,
    *,
    sandboxed: bool = False,
    idempotent: bool = False,
    requires_approval: bool = False,
    cached: bool | None = None,
    timeout_s: float | None = None,
    isolation: str = "thread",
    aliases: tuple[str, ...] = (),
    returns: str = "",
    when: str = "",
    registry: ToolRegistry = REGISTRY,
) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    """Decorator: register `func(args: args_model) -> str` as a tool. An idempotent tool's results are
    cached unless `cached=False` (a call cheaper than the cache's Redis lookup, like the calculator).
    A call has `timeout_s` (default REACTQ_TOOL_TIMEOUT_S) to answer; `isolation="process"` for a
    CPU-bound tool, so that a call past it can be killed (see ISOLATIONS). `aliases` are other names
    that reach the tool (`Calculate`, `calc`); the model is only ever shown `name`. `returns` and `when`
    tell the model what a call gives back and when to make one (the system prompt lists them)."""

    def decorate(func: Callable[[Any], str]) -> Callable[[Any], str]:
        registry.register(Tool(name, args_model, description, func, sandboxed, idempotent, requires_approval,
                               cached=idempotent if cached is None else cached and idempotent,
                               timeout_s=timeout_s, isolation=isolation, aliases=tuple(aliases),
                               returns=returns, when=when))
        return func

    return decorate
