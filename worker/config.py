"""Settings from the environment (prefix REACTQ_) and an optional settings file (REACTQ_SETTINGS_FILE,
a .env-style file). Defaults make `reactq demo` work with nothing set."""

from __future__ import annotations

import os
from datetime import date
from functools import lru_cache
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .core.models import Mode


class ModelSpec(BaseModel):
    """One model's entry in REACTQ_MODELS: its provider limits (shared by every worker), fallbacks, prices."""

    model_config = ConfigDict(extra="forbid")

    rpm: int | None = Field(None, ge=1)  # requests per minute; None: no limit
    tpm: int | None = Field(None, ge=1)  # tokens (prompt + completion) per minute
    # the provider's enforcement window: no `window_s` seconds see more than their share of rpm/tpm
    # (worker/llm/ratelimit.py); None (unknown, the default): calls spaced evenly, one interval apart, at
    # admission and at send time; 0: no window, only the burst tolerance REACTQ_LLM_LIMIT_BURST_S
    window_s: float | None = Field(None, ge=0, le=60)
    # requests in flight to its server at once, over every worker (worker/llm/in_flight.py): its slots
    # (llama.cpp's -np); None: no cap
    max_in_flight: int | None = Field(None, ge=1)
    fallbacks: list[str] = Field(default_factory=list)
    prices_per_mtok: tuple[float, float] | None = None  # USD per 1M prompt, completion tokens
    # the model's context window in tokens (llama-server's -c, the provider's limit): the conversation's
    # budget follows it (prompts.context_budget) instead of REACTQ_CONTEXT_BUDGET_TOKENS; None: that setting
    context_tokens: int | None = Field(None, ge=512)


class McpServerSpec(BaseModel):
    """One MCP server in REACTQ_MCP_SERVERS: a program the worker starts (`command`, its `env`) or a
    streamable HTTP endpoint (`url`, its `headers`, e.g. an Authorization secret)."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = Field(None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float | None = Field(None, gt=0)  # a call's deadline; None: REACTQ_TOOL_TIMEOUT_S
    start_timeout_s: float = Field(30.0, gt=0)  # to start (or connect) and list its tools
    allow_private: bool = False  # an HTTP server at a loopback/private address (like REACTQ_WEBHOOK_ALLOW_PRIVATE)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server has either a command or a url")
        if self.command is None and self.env:
            raise ValueError("env is for a command's server; an HTTP server takes headers")
        if self.url is not None and not self.url.lower().startswith(("http://", "https://")):
            raise ValueError("an MCP server's url is an http or https URL")
        if self.url is None and self.headers:
            raise ValueError("headers are for a url's server; a command's server takes env")
        return self


MCP_SERVER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"


def is_cluster_url(url: str) -> bool:
    """A Redis Cluster, named by one seed node: redis+cluster://[USER:PASSWORD@]HOST:PORT."""
    return url.startswith(("redis+cluster://", "rediss+cluster://"))


def cluster_seed_url(url: str) -> str:
    """A redis+cluster:// URL as the redis:// URL of its seed node, which redis-py's cluster client takes."""
    return url.replace("+cluster://", "://", 1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="REACTQ_",
        env_file=os.environ.get("REACTQ_SETTINGS_FILE"),
        extra="ignore",
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    # the Celery broker when it is not the state Redis: a redis:// URL of another server, or sentinel://HOST:PORT
    # (several joined by ";") with the master's name in broker_sentinel_master (docs/decisions/broker-apart.md)
    broker_url: str | None = None
    broker_sentinel_master: str | None = None
    llm_base_url: str = "http://127.0.0.1:8900/v1"
    llm_api_key: str = "reactq-stub"
    model: str = "reactq-stub"
    mode: Mode = Mode.TOOLS
    max_steps: int = Field(8, ge=1, le=200)
    metrics_port: int = 9808
    # the metrics listeners (worker/runtime/metrics_server.py): workers' /metrics, /livez, /readyz and the API's
    # /metrics bind this address (manifests set 0.0.0.0: Prometheus and the kubelet reach pods by their IP)
    metrics_host: str = "127.0.0.1"
    # the API's /metrics (tenant names, spend): on this port of its own; 0: on the API's port; unset: on the
    # API's port while `reactq api` listens on loopback only (docs/DESIGN.md's GET /metrics), else on 9807
    api_metrics_port: int | None = Field(None, ge=0, le=65535)
    # the names (Host header, any port) the API answers to; others get 400 (docs/decisions/exposure.md):
    # `*.example.com` for the names under it, `*` for any (a proxy in front checks them)
    api_allowed_hosts: list[str] = Field(default_factory=lambda: ["localhost", "127.0.0.1", "[::1]"])
    health_stale_s: float = Field(30.0, gt=0)  # no consumer heartbeat for this long (Redis up): /livez fails

    # safeguards
    max_invalid_outputs: int = Field(3, ge=1)  # invalid outputs in a row before the run fails
    repeat_hint_at: int = Field(3, ge=2)  # the same call this many times gets a hint ...
    repeat_fail_at: int = Field(4, ge=2)  # ... and this many times ends the run
    thought_hint_at: int = Field(3, ge=2)  # the same thought this many steps in a row gets a hint ...
    thought_fail_at: int = Field(4, ge=2)  # ... and this many ends the run
    no_progress_hint_at: int = Field(3, ge=2)  # the same observations this many steps in a row: a hint ...
    no_progress_fail_at: int = Field(4, ge=2)  # ... and this many end the run
    best_effort_answer: bool = True  # a run stopped at a limit makes one last call for its best answer
    observation_max_chars: int = Field(4000, ge=100)
    context_budget_tokens: int = Field(6000, ge=500)
    keep_recent_steps: int = Field(3, ge=1)
    # the longest the model may stay silent: before its first streamed chunk and between two (the whole
    # answer, with llm_stream off); the run's deadline bounds the whole call
    llm_timeout_s: float = Field(60.0, gt=0)
    llm_stream: bool = True  # stream completions (SSE); off for a server that cannot
    llm_max_retries: int = Field(4, ge=0)
    # A provider in trouble: its circuit opens for base, 2×base… up to max seconds (worker/llm/circuit.py)
    llm_circuit_base_s: float = Field(2.0, gt=0)
    llm_circuit_max_s: float = Field(60.0, gt=0)
    run_deadline_s: float = Field(1800.0, gt=0)
    reflect_every: int = Field(0, ge=0)  # 0 = off
    max_question_chars: int = Field(8000, ge=1)
    max_tokens_per_run: int = Field(0, ge=0)  # 0 = no token budget
    llm_max_tokens: int = Field(1024, ge=16)  # the max_tokens every LLM call is sent with (budgets may lower it)
    llm_temperature: float = 0.0

    # caches and durability
    tool_cache_ttl_s: int = Field(3600, ge=0)
    run_ttl_s: int = Field(7 * 24 * 3600, ge=60)  # every key of an unfinished run or batch; refreshed as it moves
    retention_s: int = Field(30 * 24 * 3600, ge=60)  # how long a finished run (and its batch) is kept
    lease_ttl_s: float = Field(15.0, gt=0)  # a dead worker's step lease lapses this fast
    stale_after_s: float = Field(30.0, gt=0)  # idle this long and no message for it in two passes: re-kicked
    reaper_scan_limit: int = Field(20_000, ge=0)  # look through at most this many queued messages per pass
    reaper_interval_s: float = Field(15.0, gt=0)
    sandbox_redispatch_after_s: int = Field(300, ge=10)  # a sandbox call not answered by then is sent again
    # A sandbox call no backend could run for this long ends its run failed (sandbox_unavailable); also read
    # by the sandbox workers (tools_sandbox/base/config.py), which send such a call again meanwhile.
    sandbox_unavailable_s: float = Field(300.0, gt=0)
    # How long a waiting sandbox call's pending marker lasts: a step that parks its call in line sets it, the
    # sandbox workers keep it alive (also read by them, tools_sandbox/base/config.py).
    sandbox_pending_ttl_s: int = Field(60, ge=15)
    visibility_timeout_s: int = Field(3600, ge=60)
    drain_timeout_s: float = Field(60.0, gt=0)  # SIGTERM: steps still running after this go back to the queue

    # capacity
    redis_max_connections: int = Field(512, ge=8)
    # on a Redis Cluster: the replicas that must acknowledge a commit or a new run before it counts (WAIT on the
    # primary's connection, up to 1 s; 0: none, asynchronous replication only; docs/decisions/redis-cluster.md)
    redis_wait_replicas: int = Field(1, ge=0, le=5)
    llm_max_connections: int = Field(512, ge=1)

    # human approval
    approval_tools: list[str] = Field(default_factory=list)  # tools whose calls wait for approval (besides
    # those registered with requires_approval=True)
    approval_timeout_s: float = Field(3600.0, gt=0)  # an unanswered call ends its run (status timeout)

    # webhooks
    webhook_allow_private: bool = False  # deliver to loopback/private/link-local addresses (SSRF guard off)
    webhook_deadline_s: float = Field(10.0, gt=0)  # one attempt in total: connect, headers, body; then it failed
    webhook_max_response_bytes: int = Field(64 * 1024, ge=0)  # of a receiver's answer read, then the connection closes
    webhook_concurrency: int = Field(8, ge=0)  # threads of the webhook worker each step worker starts (0: none)
    webhook_tenant_in_flight: int = Field(4, ge=1)  # one tenant's webhook attempts at once, cluster-wide (others wait)
    webhook_host_in_flight: int = Field(8, ge=1)  # attempts to one host name at once, cluster-wide (> the tenant cap)
    webhook_retry_threads: int = Field(4, ge=1)  # of a webhook worker's threads, at most this many make retries
    webhook_retry_base_s: float = Field(10.0, gt=0)  # first retry after this; doubles each time ...
    webhook_retry_max_s: float = Field(1800.0, gt=0)  # ... up to this (below the broker's visibility timeout)
    webhook_retry_for_s: float = Field(86400.0, gt=0)  # a delivery is given up this long after it was created

    tool_modules: list[str] = Field(default_factory=list)  # users' tool modules, imported by workers
    # MCP servers whose tools join the registry's (worker/runtime/mcp/), by name; plans' mcp_servers choose
    mcp_servers: dict[Annotated[str, StringConstraints(pattern=MCP_SERVER_NAME)], McpServerSpec] = Field(
        default_factory=dict)
    # inline tool deadlines (worker/runtime/tool_exec.py)
    tool_timeout_s: float = Field(30.0, gt=0)  # a call's deadline, unless its tool sets timeout_s
    tool_processes: int = Field(2, ge=1)  # per step worker: processes for isolation="process" tools ...
    tool_processes_per_tenant: int = Field(1, ge=1)  # ... of which one tenant's calls hold at most this many
    tool_process_nice: int = Field(10, ge=0, le=19)  # their CPU priority below the worker's
    tool_process_memory_mb: int = Field(1024, ge=0)  # their address-space cap (RLIMIT_AS); 0: none
    tool_stuck_threads_max: int = Field(64, ge=1)  # threads of calls past their deadline still running ...
    tool_stuck_threads_per_tenant: int = Field(4, ge=1)  # ... and per (tool, tenant): past either, calls are
    # refused at once ("busy") until some of those threads end

    # tenants, plans and prices
    tenants: list[str] = Field(default_factory=lambda: ["default"])  # single-operator tenants (no `tenant add`)
    tenants_plan: str = "operator"  # the plan of the tenants in REACTQ_TENANTS
    plans_file: str | None = None  # default: worker/plans.toml, shipped in the package
    max_body_bytes: int = Field(1024 * 1024, ge=1024)  # larger HTTP request bodies answer 413
    # event streams (SSE) one API process holds open at once, on a Redis pool of their own (429 past it)
    sse_max_streams_per_process: int = Field(256, ge=1)
    # the operator UI (/ui): a sign-in lasts this long (a server-side session in Redis, its cookie's Max-Age);
    # its cookie is Secure on https requests, and always when ui_cookie_secure (a TLS proxy speaking http to us)
    ui_session_ttl_s: int = Field(8 * 3600, ge=60, le=30 * 86400)
    ui_cookie_secure: bool = False
    tiers: list[str] = Field(default_factory=lambda: ["free", "standard", "pro"])
    # the sandbox tiers that exist (also read by the sandbox workers, tools_sandbox's settings); None: the
    # shipped tiers file; an unreadable file: `tiers` above
    sandbox_tiers_file: str | None = None
    prices_per_mtok: dict[str, tuple[float, float]] = Field(
        default_factory=lambda: {"reactq-stub": (0.15, 0.60)}
    )  # model -> (USD per 1M prompt tokens, USD per 1M completion tokens)
    # per-model provider limits, fallbacks and prices (REACTQ_MODELS, JSON); see worker/llm/ratelimit.py
    models: dict[str, ModelSpec] = Field(default_factory=dict)
    # a limit's burst tolerance: this many seconds' worth at once (capped below one more call per window_s)
    llm_limit_burst_s: float = Field(0.5, ge=0)
    llm_limit_max_wait_s: float = Field(2.0, ge=0)  # wait longer than this for capacity: re-queue the step
    serpapi_api_key: str | None = Field(None, validation_alias="SERPAPI_API_KEY")
    # the offline search's documents: a JSONL file of {"title", "text"} lines (default: the bundled corpus)
    search_corpus: str | None = None
    search_corpus_max_bytes: int = Field(64 * 1024 * 1024, ge=1)  # a larger file is refused, not read

    # the system prompt (worker/prompt_templates.py): an operator's templates, the agent's name, the date
    prompt_templates_dir: str | None = None  # a directory with tools.j2 and text.j2
    prompt_tools_template: str | None = None  # one file for tools mode (wins over the directory's)
    prompt_text_template: str | None = None  # one file for text mode
    agent_name: str = Field("reactq", min_length=1, max_length=100)  # a plan's agent_name wins
    prompt_date: date | None = None  # YYYY-MM-DD, stated as today (reproducible evals); default: the run's UTC day

    # the operator UI: `reactq eval --report` also stores the report in Redis for /ui/evals
    eval_report_store: bool = True  # false: the report is only written to its file
    eval_report_max_bytes: int = Field(8 * 1024 * 1024, ge=1024)  # a larger report is not stored (the file is)
    eval_reports_kept: int = Field(100, ge=1)  # per tenant; the oldest beyond go (each also expires per retention_s)

    @model_validator(mode="after")
    def _prompt_templates(self) -> Settings:
        """An operator's template is compiled and checked when the settings load (not at a run's first step)."""
        if self.prompt_templates_dir or self.prompt_tools_template or self.prompt_text_template:
            from .prompt_templates import system_template

            for mode in Mode:
                system_template(self, mode)
        return self

    @model_validator(mode="after")
    def _broker(self) -> Settings:
        """A Sentinel broker names its master; an unset broker is the state Redis."""
        if self.broker_url is not None and self.broker_url.startswith("sentinel://"):
            if not self.broker_sentinel_master:
                raise ValueError("REACTQ_BROKER_URL is a sentinel:// URL: set REACTQ_BROKER_SENTINEL_MASTER to the "
                                 "name of its master")
        elif self.broker_url is not None and not self.broker_url.startswith(("redis://", "rediss://")):
            raise ValueError("REACTQ_BROKER_URL must be a redis://, rediss:// or sentinel:// URL")
        return self

    @model_validator(mode="after")
    def _cluster_broker(self) -> Settings:
        """kombu has no Redis Cluster transport: state on a cluster needs the broker on a server of its own."""
        if self.redis_on_cluster and self.broker_url is None:
            raise ValueError("REACTQ_REDIS_URL names a Redis Cluster: set REACTQ_BROKER_URL to the Celery broker "
                             "(a redis:// or sentinel:// server apart from the cluster)")
        return self

    @property
    def redis_on_cluster(self) -> bool:
        return is_cluster_url(self.redis_url)

    @property
    def celery_broker_url(self) -> str:
        """The Celery broker: REACTQ_BROKER_URL, else the state Redis."""
        return self.broker_url or self.redis_url

    @property
    def broker_apart(self) -> bool:
        """The broker is another server than the state Redis: a step's commit cannot enqueue the next step."""
        return self.broker_url is not None and self.broker_url != self.redis_url

    @model_validator(mode="after")
    def _model_prices(self) -> Settings:
        """Prices named in REACTQ_MODELS join (and win over) REACTQ_PRICES_PER_MTOK."""
        for name, spec in self.models.items():
            if spec.prices_per_mtok is not None:
                self.prices_per_mtok[name] = spec.prices_per_mtok
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
