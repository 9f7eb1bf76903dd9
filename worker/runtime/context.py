"""The process-wide collaborators of a worker or API process, created on first use (no I/O at import).

What only some processes use (the LLM stack, the tools, metrics, leases) is imported by the property that
builds it: `reactq batch` needs the stores, not the model client (its import costs most of a CLI's start)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from ..config import Settings
from ..store.connection import Client, connect, connect_broker
from ..store.runs import RunStore
from ..store.spend import SpendStore
from ..store.tenant_records import TenantStore
from ..store.webhooks import WebhookStore
from ..tenancy.budgets import TenantBudgets
from ..tenancy.plans import AllowedTools
from ..tenancy.tenants import Tenants

if TYPE_CHECKING:
    from ..core.engine import Limits
    from ..llm.client import LLMClient
    from ..llm.in_flight import InFlightCap
    from ..llm.ratelimit import RateLimiter
    from ..store.cluster import ClusterStore
    from ..tools import ToolRegistry
    from .leases import LeaseKeeper
    from .mcp import McpTools
    from .sandbox_bridge import SandboxLine


@dataclass
class Runtime:
    settings: Settings
    llm_client: LLMClient | None = field(default=None, repr=False)  # a scripted model (tests, benchmarks)

    @cached_property
    def redis(self) -> Client:
        return connect(self.settings.redis_url, self.settings.redis_max_connections)

    @cached_property
    def broker_redis(self) -> Client:
        """The Celery broker's Redis: the state Redis unless REACTQ_BROKER_URL names another."""
        s = self.settings
        if not s.broker_apart or s.broker_url is None:
            return self.redis
        return connect_broker(s.broker_url, s.broker_sentinel_master, s.redis_max_connections)

    @cached_property
    def store(self) -> RunStore:
        return RunStore(self.redis, self.settings.run_ttl_s, self.settings.retention_s,
                        wait_replicas=self.settings.redis_wait_replicas)

    @cached_property
    def tenants(self) -> Tenants:
        return Tenants(TenantStore(self.redis), self.settings, policy_memo_s=1.0)

    def fresh_tenants(self) -> Tenants:
        """Tenants whose policies are read afresh on each call (an API submission sees a budget lowered a
        moment ago); `tenants` memoises them for a second, for the step path."""
        return Tenants(TenantStore(self.redis), self.settings)

    @cached_property
    def budgets(self) -> TenantBudgets:
        return TenantBudgets(SpendStore(self.redis))

    @cached_property
    def webhooks(self) -> WebhookStore:
        return WebhookStore(self.redis, self.settings.retention_s)

    @cached_property
    def sandbox_line(self) -> SandboxLine:
        from .sandbox_bridge import SandboxLine

        s = self.settings
        return SandboxLine(self.redis, s.sandbox_tiers_file, s.sandbox_pending_ttl_s, on_cluster=s.redis_on_cluster)

    @cached_property
    def cluster(self) -> ClusterStore:
        from ..store.cluster import ClusterStore

        return ClusterStore(self.redis, self.broker_redis)

    @cached_property
    def leases(self) -> LeaseKeeper:
        from ..store.leases import Leases
        from .leases import LeaseKeeper

        return LeaseKeeper(Leases(self.redis, self.settings.run_ttl_s), self.settings.lease_ttl_s)

    @cached_property
    def limiter(self) -> RateLimiter:
        from ..llm.ratelimit import RateLimiter
        from ..store.provider_limits import ProviderLimits

        s = self.settings
        return RateLimiter(ProviderLimits(self.redis), s.models, burst_s=s.llm_limit_burst_s,
                           max_wait_s=s.llm_limit_max_wait_s)

    @cached_property
    def llm(self) -> LLMClient:
        if self.llm_client is not None:
            return self.llm_client
        from ..llm.circuit import CircuitLLM
        from ..llm.client import OpenAIChat
        from ..llm.context_guard import ContextGuard
        from ..llm.fallback import RoutedLLM
        from ..llm.ratelimit import LimitedLLM
        from ..store.provider_circuit import ProviderCircuits

        s = self.settings
        chat = OpenAIChat(
            s.llm_base_url, s.llm_api_key, timeout_s=s.llm_timeout_s, max_retries=s.llm_max_retries,
            max_connections=s.llm_max_connections, on_attempt=_record_llm_attempt,
            on_rate_limited=self.limiter.cool_down, before_retry=self.limiter.before_retry,
            before_send=self.limiter.before_send, stream=s.llm_stream, in_flight=self._in_flight_cap(),
        )
        limited: LLMClient = LimitedLLM(chat, self.limiter) if self.limiter.models else chat
        guarded = CircuitLLM(limited, ProviderCircuits(self.redis), base_s=s.llm_circuit_base_s,
                             cap_s=s.llm_circuit_max_s)
        return ContextGuard(RoutedLLM(guarded, s.models))

    def _in_flight_cap(self) -> InFlightCap | None:
        caps = {name: spec.max_in_flight for name, spec in self.settings.models.items() if spec.max_in_flight}
        if not caps:
            return None
        from ..llm.in_flight import InFlightCap
        from ..store.llm_slots import LLMSlots

        return InFlightCap(LLMSlots(self.redis), caps, hold_s=self.settings.llm_timeout_s + 5)

    @cached_property
    def tools(self) -> ToolRegistry:
        """The registry's tools, and the MCP servers' when REACTQ_MCP_SERVERS names any."""
        from ..tools import REGISTRY
        from ..tools.search import SearchSource
        from ..tools.search import use_source as use_search_source

        s = self.settings
        use_search_source(SearchSource(s.serpapi_api_key, s.search_corpus, s.search_corpus_max_bytes))
        REGISTRY.load_modules(s.tool_modules)
        if self.mcp is None:
            return REGISTRY
        from .mcp.toolset import ToolsWithMcp  # the MCP SDK is imported only where servers are configured

        return ToolsWithMcp(REGISTRY, self.mcp)

    @cached_property
    def mcp(self) -> McpTools | None:
        """This process's MCP servers (none started until a step needs their tools)."""
        s = self.settings
        if not s.mcp_servers:
            return None
        from .mcp import McpTools

        return McpTools(s.mcp_servers, timeout_s=s.tool_timeout_s, allow_private=s.webhook_allow_private)

    def tools_for(self, tenant: str) -> ToolRegistry | AllowedTools:
        """The tools `tenant`'s plan allows (read from Redis each time: a plan change applies at once)."""
        policy = self.tenants.policy(tenant)
        return self.tools if policy is None else AllowedTools(self.tools, policy.plan)

    @property
    def limits(self) -> Limits:
        from ..core.engine import Limits  # the step worker's: the CLI's runtime never loads the engine

        s = self.settings
        return Limits(
            max_invalid_outputs=s.max_invalid_outputs, repeat_hint_at=s.repeat_hint_at,
            repeat_fail_at=s.repeat_fail_at, observation_max_chars=s.observation_max_chars,
            max_tokens_per_run=s.max_tokens_per_run,
            thought_hint_at=s.thought_hint_at, thought_fail_at=s.thought_fail_at,
            no_progress_hint_at=s.no_progress_hint_at, no_progress_fail_at=s.no_progress_fail_at,
        )


def _record_llm_attempt(model: str, outcome: str, seconds: float) -> None:
    from .. import metrics

    metrics.LLM_REQUESTS.labels(model, outcome).inc()
    metrics.LLM_DURATION.labels(model).observe(seconds)


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime(settings: Callable[[], Settings]) -> Runtime:
    """The process's runtime, built once from `settings()`, which its first caller passes: a task module, the
    CLI or the API, the layers that read the environment (nothing below them does)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime(settings())
        return _runtime


def close_mcp_servers() -> None:
    """Stop the process's MCP servers, if its runtime started any (a worker's shutdown)."""
    with _lock:
        runtime = _runtime
    mcp = runtime.__dict__.get("mcp") if runtime is not None else None
    if mcp is not None:
        mcp.close()
