"""Plans: the sandbox tiers, tools, budgets and admission limits a tenant gets, from a TOML file
(`worker/plans.toml`, shipped in the package; `REACTQ_PLANS_FILE` points elsewhere). Pure apart from
reading that file."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from ..config import Settings
from ..errors import PlanConfigError

DEFAULT_PLANS_FILE = Path(__file__).with_name("plans.toml")
ALL_TOOLS = "*"
ALL_TIERS = "*"  # `tiers = ["*"]`: every tier of the sandbox tiers file, those added later included


class Budgets(BaseModel, extra="forbid"):
    """Spend a tenant may have per UTC day and per calendar month; 0 means no limit."""

    tokens_per_day: int = Field(0, ge=0)
    tokens_per_month: int = Field(0, ge=0)
    usd_per_day: float = Field(0.0, ge=0)
    usd_per_month: float = Field(0.0, ge=0)


BUDGET_FIELDS = tuple(Budgets.model_fields)


class PlanLimits(BaseModel, extra="forbid"):
    """Admission limits."""

    runs_in_flight: int = Field(ge=1)
    submissions_per_minute: int = Field(ge=1)
    sse_streams: int = Field(ge=1)


class Plan(BaseModel, extra="forbid"):
    name: str
    tiers: list[str] = Field(min_length=1)
    default_tier: str | None = None
    tools: list[str] = Field(default_factory=lambda: [ALL_TOOLS])
    mcp_servers: list[str] = Field(default_factory=list)  # REACTQ_MCP_SERVERS names whose tools it gets; ["*"]: all
    approval_required: list[str] = Field(default_factory=list)
    budgets: Budgets = Field(default_factory=Budgets)
    limits: PlanLimits
    agent_name: str | None = Field(None, min_length=1, max_length=100)  # the system prompt's name for the agent
    instructions: str = Field("", max_length=4000)  # added to every system prompt of the plan's runs
    python_session: bool = False  # the default of a run's python_session (worker/core/sessions.py)

    @model_validator(mode="after")
    def _default_tier(self) -> Plan:
        if ALL_TIERS in self.tiers:
            if self.tiers != [ALL_TIERS]:
                raise ValueError('"*" (every tier) stands alone in tiers')
            if self.default_tier is None:
                raise ValueError('a plan with tiers = ["*"] names its default_tier')
        elif self.default_tier is None:
            self.default_tier = self.tiers[-1]
        elif self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} is not one of its tiers {self.tiers}")
        return self

    def allows(self, tool: Any) -> bool:
        """A registered tool by its name (`tools`); an MCP server's tool by its server (`mcp_servers`)."""
        server = getattr(tool, "server", "")
        if server:
            return ALL_TOOLS in self.mcp_servers or server in self.mcp_servers
        return self.allows_tool(tool.name)

    def allows_tool(self, name: str) -> bool:
        return ALL_TOOLS in self.tools or name.strip().lower() in {t.lower() for t in self.tools}


def parse_plans(text: str, source: str = "<string>", tiers: Sequence[str] | None = None) -> dict[str, Plan]:
    """The plans of a TOML text; with `tiers` (the tiers file's), `["*"]` becomes that list."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanConfigError(f"{source}: invalid TOML: {exc}") from None
    raw = data.get("plans")
    if not isinstance(raw, dict) or not raw:
        raise PlanConfigError(f"{source}: no [plans.<name>] tables")
    plans: dict[str, Plan] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            raise PlanConfigError(f"{source}: plans.{name} must be a table")
        try:
            plan = Plan(name=name, **spec)
            if tiers is not None and plan.tiers == [ALL_TIERS]:
                plan = Plan(name=name, **{**spec, "tiers": list(tiers)})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise PlanConfigError(f"{source}: plan {name!r} is invalid: {problems}") from None
        plans[name] = plan
    return plans


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, tiers: tuple[str, ...]) -> dict[str, Plan]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanConfigError(f"cannot read plans file {path}: {exc.strerror}") from None
    return parse_plans(text, source=path, tiers=tiers)


def load_plans(path: str | Path | None = None, tiers: Sequence[str] | None = None,
               tiers_file: str | None = None) -> dict[str, Plan]:
    """All plans from `path` (default: the shipped file), re-read when it or the tiers file changes.
    `tiers = ["*"]` is every tier of `tiers` (default: the sandbox tiers file's, in its order)."""
    p = Path(path) if path else DEFAULT_PLANS_FILE
    try:
        mtime = p.stat().st_mtime_ns
    except OSError as exc:
        raise PlanConfigError(f"cannot read plans file {p}: {exc.strerror}") from None
    return _load_cached(str(p), mtime, tuple(_tiers_file_tiers(tiers_file) if tiers is None else tiers))


def _tiers_file_tiers(tiers_file: str | None) -> list[str]:
    """The tiers of tools_sandbox's tiers file in its order, else the settings' default list."""
    try:
        from tools_sandbox import load_tiers

        return list(load_tiers(tiers_file))
    except Exception:  # tools_sandbox absent or its tiers file unreadable: fall back to settings
        return list(Settings.model_fields["tiers"].get_default(call_default_factory=True))


class AllowedTools:
    """A tool registry as one plan sees it: tools the plan does not allow are neither offered to the
    model nor run; a call to one is refused with a reason (`refusal`)."""

    def __init__(self, registry: Any, plan: Plan) -> None:
        self.registry = registry
        self.plan = plan

    @property
    def _offered(self) -> Any:
        """A plan without MCP servers reads the registry beneath them (`base`, when the registry has
        servers): its steps never wait for a server to start or be retried."""
        return self.registry if self.plan.mcp_servers else getattr(self.registry, "base", self.registry)

    def get(self, name: str) -> Any:
        tool = self._offered.get(name)
        return tool if tool is not None and self.plan.allows(tool) else None

    def names(self) -> list[str]:
        return sorted(t.name for t in self.all())

    def all(self) -> list[Any]:
        return [t for t in self._offered.all() if self.plan.allows(t)]

    def refusal(self, name: str) -> str | None:
        tool = self._offered.get(name)
        if tool is None or self.plan.allows(tool):
            return None
        return (f"tool {tool.name!r} is not allowed on this tenant's plan ({self.plan.name!r}); "
                f"available tools: {', '.join(self.names()) or 'none'}")


def known_tiers(settings: Settings) -> list[str]:
    """The sandbox tiers that exist: tools_sandbox's tiers file, else the settings' list."""
    try:
        from tools_sandbox import load_tiers

        return sorted(load_tiers(settings.sandbox_tiers_file))
    except Exception:  # tools_sandbox absent or its tiers file unreadable: fall back to settings
        return list(settings.tiers)
