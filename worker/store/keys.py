"""Every Redis key reactq uses, in one place."""

from collections.abc import Iterable

PREFIX = "reactq"

# On a Redis Cluster (REACTQ_REDIS_URL=redis+cluster://...) every key of one batch, one tenant or one model
# carries that id as its hash tag ("{id}"), and every key of one run the first RUN_TAG_CHARS characters of
# its id ("{abc}def..."), so each lives on one shard and a script may touch several of them; the active set
# is one key per run tag, beside its runs (docs/decisions/redis-cluster.md). A single Redis keeps the names it
# always had: nothing to migrate. Every process of a deployment connects the same way, so they agree;
# connection.connect() switches this on for a cluster URL.
_hash_tags = False


def use_hash_tags(on: bool) -> None:
    global _hash_tags
    _hash_tags = on


def hash_tags() -> bool:
    return _hash_tags


def tag(id_: str) -> str:
    """`id_` as a key segment: a hash tag on a cluster, itself on a single Redis."""
    return "{" + id_ + "}" if _hash_tags else id_


RUN_TAG_CHARS = 3  # run ids are hex: 4096 run tags, spread over the cluster's slots


def run_tag(run_id: str) -> str:
    """A run's key segment: on a cluster its first RUN_TAG_CHARS characters are its hash tag (so the
    active set of its tag shares its slot), on a single Redis the id itself."""
    if not _hash_tags:
        return run_id
    return "{" + run_id[:RUN_TAG_CHARS] + "}" + run_id[RUN_TAG_CHARS:]


def run(run_id: str) -> str:
    return f"{PREFIX}:run:{run_tag(run_id)}"


def steps(run_id: str) -> str:
    return f"{PREFIX}:run:{run_tag(run_id)}:steps"


def events(run_id: str) -> str:
    return f"{PREFIX}:run:{run_tag(run_id)}:events"


def events_compacted(run_id: str) -> str:
    """A finished run's events, compacted into one JSON string: [[entry id, type, data or step index]]."""
    return f"{PREFIX}:run:{run_tag(run_id)}:history"


def reply(run_id: str, step: int) -> str:
    """The stored LLM reply of one step: a redelivered step reuses it."""
    return f"{PREFIX}:run:{run_tag(run_id)}:reply:{step}"


def tool_results(run_id: str, step: int) -> str:
    """hash: call id -> the stored result (an Observation) of each tool call of one step."""
    return f"{PREFIX}:run:{run_tag(run_id)}:obs:{step}"


def sandbox_dispatch(run_id: str, step: int, call_id: str) -> str:
    """Set when a sandboxed call has been sent, so a re-run of the step does not send it again."""
    return f"{PREFIX}:run:{run_tag(run_id)}:sent:{step}:{call_id}"


def sandbox_pending(run_id: str, step: int) -> str:
    """Kept alive (a TTL) by the sandbox task of any of the step's calls while it waits in line or runs:
    the reaper re-sends a lost call only once it has expired. In the sandbox worker's ACL namespace
    (`reactq:run:*:sandbox:*`, deploy/redis/acl.conf); never a result key (those have a step number there)."""
    return f"{PREFIX}:run:{run_tag(run_id)}:sandbox:pending:{step}"


def outbox(run_id: str) -> str:
    """list, on a Redis Cluster: the run's writes to other shards not yet applied there (store/outbox.py)."""
    return f"{PREFIX}:run:{run_tag(run_id)}:outbox"


def lease(run_id: str) -> str:
    """Held by the worker executing a run's step, so duplicates of that step back off."""
    return f"{PREFIX}:run:{run_tag(run_id)}:lease"


def tool_cache(tenant: str, tool: str, digest: str) -> str:
    """An idempotent tool's result for (tool, arguments digest), per tenant: one tenant's cache never
    answers another's call, which would tell it what the other asked (tenant names have no ':')."""
    return f"{PREFIX}:cache:{tag(tenant)}:{tool}:{digest}"


ACTIVE_RUNS = f"{PREFIX}:active"  # zset: run id -> last progress time (the reaper scans it)


def active_runs(run_id: str) -> str:
    """The active set that holds `run_id`: ACTIVE_RUNS on a single Redis; on a cluster one per run tag, in
    the slot of the run's own keys, so that a step's commit updates it in its own script."""
    return f"{ACTIVE_RUNS}:{{{run_id[:RUN_TAG_CHARS]}}}" if _hash_tags else ACTIVE_RUNS


def active_sets() -> list[str]:
    """Every active set (what the reaper scans and counts)."""
    if not _hash_tags:
        return [ACTIVE_RUNS]
    return [f"{ACTIVE_RUNS}:{{{i:0{RUN_TAG_CHARS}x}}}" for i in range(16 ** RUN_TAG_CHARS)]


def by_active_set(run_ids: Iterable[str]) -> dict[str, list[str]]:
    """These runs grouped by the active set that holds each, in their order."""
    groups: dict[str, list[str]] = {}
    for run_id in run_ids:
        groups.setdefault(active_runs(run_id), []).append(run_id)
    return groups


# On a cluster: how many runs the active sets held at the last reaper pass (counting 4,096 sets is the
# reaper's once per pass, not every process's and every scrape's).
ACTIVE_COUNT = f"{PREFIX}:active-count"


def is_active_set(key: str | bytes) -> bool:
    name = key.decode() if isinstance(key, bytes) else key
    return name == ACTIVE_RUNS or name.startswith(ACTIVE_RUNS + ":{")
REAPER_LOCK = f"{PREFIX}:reaper:lock"


def batch(batch_id: str) -> str:
    """hash: `created_at`, `tenant`, `size`, `submitting` (while chunks go in), `webhook_url`, usage sums
    (`prompt_tokens`, `completion_tokens`, `cost_usd`) and, per status, `status:<status>`: how many of its
    runs ended so (counted in the transaction that records each end). `counts_statuses` marks a batch
    created since those counters exist."""
    return f"{PREFIX}:batch:{tag(batch_id)}"


BATCH_STATUS_FIELD = "status:"  # + a run status: a field of the batch hash
BATCH_COUNTS_STATUSES = "counts_statuses"


def batch_runs(batch_id: str) -> str:
    return f"{PREFIX}:batch:{tag(batch_id)}:runs"


def batch_done(batch_id: str) -> str:
    """List of run ids in the order they finished."""
    return f"{PREFIX}:batch:{tag(batch_id)}:done"


def tenant_usage(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tag(tenant)}:usage"


def sandbox_result(run_id: str, step: int, call_id: str) -> str:
    """Where a sandbox worker stores its result object for one call."""
    return f"{PREFIX}:run:{run_tag(run_id)}:sandbox:{step}:{call_id}"


def workers(queue: str) -> str:
    """zset of live workers consuming `queue`: member host:pid, score = last heartbeat."""
    return f"{PREFIX}:workers:{queue}"


def batch_ids(batch_id: str) -> str:
    """hash: the batch input's `id` -> run id."""
    return f"{PREFIX}:batch:{tag(batch_id)}:ids"


def batch_file(digest: str) -> str:
    """The batch last submitted for one output file (so a re-run adopts its runs)."""
    return f"{PREFIX}:batchfile:{digest}"


# --- tenants, keys, budgets, admission (store: tenant_records, spend, submissions, streams) ----
TENANTS = f"{PREFIX}:tenants"  # set of the ids of the tenants added with `reactq tenant add`
TENANT_IDS = f"{PREFIX}:tenantids"  # hash: tenant name -> its id now (core/tenant_ids.py; absent: id = name)
API_KEYS = f"{PREFIX}:apikeys"  # set of every API key id (revoked ones included)


def tenant(name: str) -> str:
    """hash, by tenant id: name, plan, created_at, and budget overrides (tokens_per_day, usd_per_month, ...).
    Every `tenant:<x>:...` key is by tenant id too (core/tenant_ids.py)."""
    return f"{PREFIX}:tenant:{tag(name)}"


def tenant_keys(name: str) -> str:
    """set of the tenant's API key ids."""
    return f"{PREFIX}:tenant:{tag(name)}:keys"


def api_key(key_id: str) -> str:
    """hash: tenant, sha256 (hex digest of the whole key), created_at, revoked_at."""
    return f"{PREFIX}:apikey:{key_id}"


def tenant_runs(name: str) -> str:
    """zset: the tenant's run ids scored by creation time (`GET /v1/runs`, newest first)."""
    return f"{PREFIX}:tenant:{tag(name)}:runs"


def tenant_inflight(name: str) -> str:
    """set: the tenant's unfinished run ids (admission: runs in flight)."""
    return f"{PREFIX}:tenant:{tag(name)}:inflight"


def tenant_spend(name: str, period: str) -> str:
    """hash {tokens, usd}: spent and reserved in one period, `d:YYYY-MM-DD` or `m:YYYY-MM` (UTC)."""
    return f"{PREFIX}:tenant:{tag(name)}:spend:{period}"


def tenant_submissions(name: str, minute: int) -> str:
    """counter: runs submitted in one minute (admission: submissions per minute)."""
    return f"{PREFIX}:tenant:{tag(name)}:submits:{minute}"


def tenant_streams(name: str) -> str:
    """zset: open event streams, member = stream id, score = when it lapses unless renewed."""
    return f"{PREFIX}:tenant:{tag(name)}:streams"


def approval_counted(run_id: str, step: int, call_id: str) -> str:
    """Set once a worker has counted this call's approval decision in its metrics."""
    return f"{PREFIX}:run:{run_tag(run_id)}:approval:{step}:{call_id}"


def tenant_webhook(tenant: str) -> str:
    """hash: the tenant's default webhook `url` (optional) and signing `secret`."""
    return f"{PREFIX}:tenant:{tag(tenant)}:webhook"


def webhook_delivery(delivery_id: str) -> str:
    """A webhook delivery record (JSON): target, body, state and every attempt with its status."""
    return f"{PREFIX}:webhook:{delivery_id}"


def tenant_deliveries(tenant: str) -> str:
    """zset: the tenant's webhook delivery ids, scored by creation time."""
    return f"{PREFIX}:tenant:{tag(tenant)}:deliveries"


WEBHOOK_SLOTS_TAG = "webhook-slots"  # a tenant's and a host's attempt slots are taken in one script: one slot


def webhook_tenant_in_flight(tenant: str) -> str:
    """sorted set: a token per webhook attempt of the tenant in flight -> when its hold lapses (ms, Redis's
    clock); at most `webhook_tenant_in_flight` members (worker/store/webhook_slots.py)."""
    return f"{PREFIX}:tenant:{tenant}:{tag(WEBHOOK_SLOTS_TAG)}webhooks_in_flight"


def webhook_host_in_flight(host: str) -> str:
    """sorted set: the same, per destination host name (of every tenant); at most `webhook_host_in_flight`."""
    return f"{PREFIX}:webhook_host:{host}:{tag(WEBHOOK_SLOTS_TAG)}in_flight"


def batch_webhook_sent(batch_id: str) -> str:
    """Set once the batch's `finished` webhook has been queued (the last two runs may finish together)."""
    return f"{PREFIX}:batch:{tag(batch_id)}:webhook"


def llm_limit(model: str, budget: str) -> str:
    """string: a provider budget's GCRA theoretical arrival time (µs, Redis clock); budget rpm | tpm."""
    return f"{PREFIX}:llm:{tag(model)}:limit:{budget}"


def llm_window(model: str) -> str:
    """list: the Redis times (µs) of a model's latest calls sent, newest first, at most a window's share."""
    return f"{PREFIX}:llm:{tag(model)}:window"


def llm_cooldown(model: str) -> str:
    """string with a TTL: set after a provider 429; no worker calls the model until it expires."""
    return f"{PREFIX}:llm:{tag(model)}:cooldown"


def llm_circuit(model: str) -> str:
    """string with a TTL: the model's circuit is open (its provider failing); no worker calls it until it
    expires. Its value is how many calls failed in a row when it was opened."""
    return f"{PREFIX}:llm:{tag(model)}:circuit"


def llm_in_flight(model: str) -> str:
    """sorted set: a token per request in flight to the model's server -> when its hold lapses (ms, Redis's
    clock); at most the model's max_in_flight members (worker/store/llm_slots.py)."""
    return f"{PREFIX}:llm:{tag(model)}:in_flight"


def llm_failures(model: str) -> str:
    """string (integer, with a TTL): the model's calls that failed in a row with a transient error."""
    return f"{PREFIX}:llm:{tag(model)}:failures"


def tenant_submitted(tenant: str, minute: int) -> str:
    """string counter with a TTL: runs a tenant submitted in one minute, kept for the fairness window
    (worker/tenancy/fairness.py; admission's per-minute limit has its own shorter-lived counter)."""
    return f"{PREFIX}:tenant:{tag(tenant)}:submitted:{minute}"


def step_taken(run_id: str) -> str:
    """string "INDEX:UNIX_TIME": the last step of the run a worker received (the reaper reads it)."""
    return f"{PREFIX}:run:{run_tag(run_id)}:taken"


def reaper_suspect(run_id: str) -> str:
    """string with a TTL: the step index the reaper found no message for on its last pass."""
    return f"{PREFIX}:reaper:suspect:{run_tag(run_id)}"


CELERY_UNACKED = "unacked"  # kombu's Redis transport: hash of messages taken and not yet acked
CELERY_UNACKED_INDEX = "unacked_index"  # ... and when each was taken (a zset of the same tags)


# --- the operator UI: eval reports, batch indexes, workers' metric snapshots -------------
BATCHES = f"{PREFIX}:batches"  # zset: every batch id with an owner, scored by creation time (the UI's list)


def tenant_batches(tenant: str) -> str:
    """zset: the tenant's batch ids scored by creation time (the UI's batches page)."""
    return f"{PREFIX}:tenant:{tag(tenant)}:batches"


def tenant_eval_reports(tenant: str) -> str:
    """zset: the tenant's stored `reactq eval --report` reports, scored by when they were stored."""
    return f"{PREFIX}:tenant:{tag(tenant)}:evalreports"


def eval_report(tenant: str, report_id: str) -> str:
    """hash: one stored eval report: name, created_at, summary (JSON), html (zlib-compressed)."""
    return f"{PREFIX}:tenant:{tag(tenant)}:evalreport:{report_id}"


REAPER_RECENT = f"{PREFIX}:reaper:recent"  # list: the reaper's latest actions on runs (JSON), newest first
WORKER_SNAPSHOTS = f"{PREFIX}:workers:snapshots"  # zset: worker member (host:pid) -> when it last published


def worker_snapshot(member: str) -> str:
    """string with a TTL: a worker process's own metrics as it last published them (JSON; the ops page).
    Under `reactq:workers:*`, which the sandbox worker's Redis user may write (deploy/redis/acl.conf)."""
    return f"{PREFIX}:workers:snapshot:{member}"


# --- the operator UI (store: ui_sessions) ---------------------------------------------------------
OPERATOR_KEYS = f"{PREFIX}:operatorkeys"  # set of the operator API key ids (`reactq key create --operator`)


def ui_session(digest: str) -> str:
    """hash, with a TTL: one UI sign-in (key_id, tenant, operator, csrf, created_at), by the SHA-256 of
    its cookie's token (a Redis dump holds no usable session)."""
    return f"{PREFIX}:ui:session:{digest}"
