"""Tenant ids on a real redis-server, in process: a name is given a new id each time it is added, a tenant
recorded before ids (or listed in REACTQ_TENANTS) has its name as its id, removing by name or by id frees
the name, and a removed tenant's data gets the retention TTL or is deleted at once."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis

from worker.config import Settings
from worker.core.tenant_ids import TENANT_ID, tenant_name
from worker.errors import InvalidRequest
from worker.store import keys
from worker.store.tenant_data import TenantData
from worker.store.tenant_records import TenantStore
from worker.tenancy.tenants import Tenants


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def tenants_on(client: redis.Redis, redis_url: str) -> Tenants:
    return Tenants(TenantStore(client), Settings(redis_url=redis_url, tenants=["default", "ops"]))


def test_each_add_of_a_name_makes_a_new_id_and_removal_frees_the_name(client: redis.Redis, redis_url: str) -> None:
    tenants = tenants_on(client, redis_url)
    first = tenants.add("xco", "standard")
    assert re.fullmatch(r"xco\.[0-9a-f]{16}", first) and TENANT_ID.fullmatch(first) and tenant_name(first) == "xco"
    assert tenants.resolve("xco") == first and tenants.id_of(first) == first
    with pytest.raises(InvalidRequest, match="exists already"):
        tenants.add("xco", "standard")
    key = tenants.create_key("xco")
    assert client.hget(keys.api_key(key.key_id), "tenant") == first.encode()
    assert tenants.remove("xco") == (first, [key.key_id])
    assert tenants.id_of("xco") is None and tenants.policy(first) is None
    second = tenants.add("xco", "free")
    assert second != first and tenants.resolve("xco") == second
    assert tenants.remove(second)[0] == second  # by its id: the name is freed too
    assert tenants.id_of("xco") is None and client.hget(keys.TENANT_IDS, "xco") is None
    assert tenants.add("xco", "standard") not in (first, second)


def test_a_tenant_recorded_by_name_or_configured_has_its_name_as_id(client: redis.Redis, redis_url: str) -> None:
    client.hset("reactq:tenant:legacy", mapping={"plan": "standard", "created_at": "1"})  # as before ids
    client.sadd("reactq:tenants", "legacy")
    tenants = tenants_on(client, redis_url)
    assert tenants.resolve("legacy") == "legacy" and tenants.resolve("default") == "default"
    policy = tenants.policy("legacy")
    assert policy is not None and policy.plan.name == "standard" and policy.name == "legacy"
    with pytest.raises(InvalidRequest, match="exists already"):
        tenants.add("legacy", "free")
    assert tenants.add("ops", "pro") == "ops"  # a configured tenant keeps its identity when given a record
    client.hset(keys.tenant_webhook("ops"), "secret", "s" * 64)
    assert tenants.remove("ops")[0] == "ops" and tenants.resolve("ops") == "ops"  # listed: it still exists...
    assert client.hget(keys.tenant_webhook("ops"), "secret") == b"s" * 64  # ... and keeps its webhook secret
    assert tenants.add("ops", "pro") == "ops"
    assert set(tenants.ids()) == {"default", "ops", "legacy"}
    tenants.remove("legacy")
    again = tenants.add("legacy", "free")
    assert again.startswith("legacy.") and set(tenants.names()) == {"default", "ops", "legacy"}
    with pytest.raises(InvalidRequest, match="unknown tenant 'nobody'"):
        tenants.resolve("nobody")


def test_a_removed_tenants_data_expires_with_retention_or_goes_at_once(client: redis.Redis) -> None:
    data = TenantData(client)
    for tenant_id in ("xco.0123456789abcdef", "xco.fedcba9876543210"):
        client.zadd(keys.tenant_runs(tenant_id), {"r1": 1.0})
        client.hset(keys.tenant_usage(tenant_id), "prompt_tokens", 5)
        client.set(keys.tool_cache(tenant_id, "search", "d1"), "x")
        client.set(keys.tenant_spend(tenant_id, "d:2026-12-06"), "1", ex=999_999)
    gone, kept = "xco.0123456789abcdef", "xco.fedcba9876543210"
    assert data.expire_all(gone, 3600) == 3  # the spend key keeps its own TTL
    assert 0 < client.ttl(keys.tenant_runs(gone)) <= 3600 and client.ttl(keys.tenant_spend(gone, "d:2026-12-06")) > 3600
    assert client.ttl(keys.tenant_runs(kept)) == -1  # another tenant of the same name: untouched
    assert data.delete_all(gone) == 4
    assert client.keys(f"*{gone}*") == [] and len(client.keys(f"*{kept}*")) == 4
